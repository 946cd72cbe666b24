"""gtm.data: the folder the product's data is read from, and files read whatever their
compression."""

from __future__ import annotations

import gzip
import lzma
from collections.abc import Callable
from pathlib import Path

import pytest

import gtm.data
from gtm.data import data_dir, find, read_text


def test_the_data_folder_is_the_package_unless_overridden(tmp_path: Path) -> None:
    assert data_dir({}) == Path(gtm.data.__file__).parent
    assert data_dir({"GTM_DATA_DIR": str(tmp_path)}) == tmp_path
    assert data_dir({"GTM_DATA_DIR": ""}) == Path(gtm.data.__file__).parent


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [("", lambda b: b), (".xz", lzma.compress), (".gz", gzip.compress)],
)
def test_a_file_is_read_by_its_plain_name_in_any_form(
    tmp_path: Path, suffix: str, compress: Callable[[bytes], bytes]
) -> None:
    (tmp_path / f"t.csv{suffix}").write_bytes(compress("\ufeffa,b\n1,2\n".encode()))
    assert find(tmp_path / "t.csv") == tmp_path / f"t.csv{suffix}"
    assert read_text(tmp_path / "t.csv") == "a,b\n1,2\n"


def test_the_plain_file_wins_over_a_compressed_one(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("plain")
    (tmp_path / "t.csv.xz").write_bytes(lzma.compress(b"compressed"))
    assert read_text(tmp_path / "t.csv") == "plain"


def test_missing_and_corrupt_files_are_os_errors_naming_the_file(tmp_path: Path) -> None:
    assert find(tmp_path / "none.csv") == tmp_path / "none.csv"
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "none.csv")
    (tmp_path / "bad.csv.xz").write_bytes(b"not xz")
    with pytest.raises(OSError, match=r"bad\.csv\.xz: corrupt archive"):
        read_text(tmp_path / "bad.csv")
    (tmp_path / "latin.csv").write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(OSError, match="not utf-8-sig text"):
        read_text(tmp_path / "latin.csv")


@pytest.mark.parametrize(
    "name",
    [
        "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
        "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
        "traces/mooncake/conversation_trace.jsonl",
        "geo/cities_top5000.csv",
    ],
)
def test_the_shipped_files_are_compressed_with_their_licence_beside_them(name: str) -> None:
    stored = find(data_dir({}) / name)
    assert stored.suffix == ".xz"
    assert any(p.name.startswith("LICENSE") for p in stored.parent.iterdir())
    assert read_text(stored).count("\n") > 1000


def test_messages_say_where_the_data_folder_came_from() -> None:
    assert gtm.data.origin({}) == "the data shipped with gtm"
    assert gtm.data.origin({"GTM_DATA_DIR": "/x"}) == "$GTM_DATA_DIR = /x"

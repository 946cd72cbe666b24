"""Worker keys (zone_agent.credentials): where each worker's key comes from, that a
record may only point inside what the operator set aside, reload on change, and that a
key never shows in a repr or an error."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from gtm.errors import ConfigError
from gtm.models import GpuWorker
from zone_agent.config import parse_worker
from zone_agent.credentials import (
    KEY_LABEL,
    KeyRef,
    KeySource,
    WorkerKey,
    WorkerKeyConfig,
    WorkerKeys,
    read_key,
    record_ref,
)

SECRET = "sk-worker-5e3f"


def worker(wid: str, *labels: tuple[str, str]) -> GpuWorker:
    return GpuWorker(
        id=wid,
        zone_id="z",
        region_id="r",
        url="http://127.0.0.1:1",
        gpu_type="H100",
        models=("m",),
        labels=labels,
    )


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def bearer(key: str) -> tuple[str, str]:
    return ("Authorization", f"Bearer {key}")


def test_the_zone_key_from_a_file_goes_to_every_worker(tmp_path: Path) -> None:
    keys = WorkerKeys(WorkerKeyConfig(file=write(tmp_path / "key", SECRET + "\n")))
    keys.update([worker("a"), worker("b")])
    assert keys.header("a") == keys.header("b") == bearer(SECRET)
    assert keys.header("unknown") is None


def test_the_zone_key_from_the_environment() -> None:
    keys = WorkerKeys(WorkerKeyConfig(env="ZONE_KEY"), environ={"ZONE_KEY": SECRET})
    keys.update([worker("a")])
    assert keys.header("a") == bearer(SECRET)


def test_without_any_key_no_header() -> None:
    keys = WorkerKeys(WorkerKeyConfig())
    keys.update([worker("a")])
    assert not keys.enabled
    assert keys.header("a") is None


def test_a_zone_key_that_cannot_be_read_stops_the_agent_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=f"cannot read file {missing}"):
        WorkerKeys(WorkerKeyConfig(file=missing))
    with pytest.raises(ConfigError, match="environment variable ZONE_KEY is not set"):
        WorkerKeys(WorkerKeyConfig(env="ZONE_KEY"), environ={})
    with pytest.raises(ConfigError, match=f"file {tmp_path / 'empty'} is empty"):
        WorkerKeys(WorkerKeyConfig(file=write(tmp_path / "empty", "\n")))


def test_file_and_variable_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="not both"):
        WorkerKeyConfig(file=Path("/k"), env="K")


def test_first_match_wins_own_reference_then_directory_then_zone(tmp_path: Path) -> None:
    directory = tmp_path / "keys"
    directory.mkdir()
    write(directory / "by-id", "key-by-id")
    write(directory / "named", "key-named")
    own = write(tmp_path / "own", "key-own")
    keys = WorkerKeys(
        WorkerKeyConfig(file=write(tmp_path / "zone", "key-zone"), directory=directory),
        static={"static": KeyRef(source=KeySource.FILE, name=str(own))},
        environ={"GTM_WORKER_KEY_B": "key-env"},
    )
    keys.update(
        [
            worker("static"),
            worker("by-id"),
            worker("labelled", (KEY_LABEL, "file:named")),
            worker("env", (KEY_LABEL, "env:GTM_WORKER_KEY_B")),
            worker("other"),
        ]
    )
    assert keys.header("static") == bearer("key-own")
    assert keys.header("by-id") == bearer("key-by-id")
    assert keys.header("labelled") == bearer("key-named")
    assert keys.header("env") == bearer("key-env")
    assert keys.header("other") == bearer("key-zone")


@pytest.mark.parametrize(
    ("label", "why"),
    [
        ("file:/etc/passwd", "only name a file in the key directory"),
        ("file:../zone", "only name a file in the key directory"),
        ("env:GTM_PEER_TOKEN", "only name variables GTM_WORKER_KEY_"),
        (SECRET, "expected file:PATH or env:NAME"),
    ],
)
def test_a_record_may_only_point_inside_what_the_operator_set_aside(
    tmp_path: Path, label: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError, match=why):
        record_ref(worker("w", (KEY_LABEL, label)), tmp_path)
    # In the agent: logged (once), that worker gets no key — not the zone's.
    keys = WorkerKeys(
        WorkerKeyConfig(file=write(tmp_path / "zone", "key-zone")),
        environ={"GTM_PEER_TOKEN": "tiers-key"},
    )
    with caplog.at_level(logging.ERROR, "zone_agent.credentials"):
        keys.update([worker("w", (KEY_LABEL, label))])
        keys.update([worker("w", (KEY_LABEL, label))])
    assert keys.header("w") is None
    assert len(caplog.records) == 1
    assert SECRET not in caplog.text


def test_a_record_naming_a_file_needs_the_key_directory() -> None:
    with pytest.raises(ConfigError, match="no --worker-api-key-dir"):
        record_ref(worker("w", (KEY_LABEL, "file:w")), None)


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_last_key(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "key", "first")
    keys = WorkerKeys(WorkerKeyConfig(file=path))
    keys.update([worker("a")])
    keys.reload()
    assert keys.header("a") == bearer("first")
    write(path, "second-key")  # another size: the stamp changes even within one tick
    keys.reload()
    assert keys.header("a") == bearer("second-key")
    os.unlink(path)
    keys.reload()
    assert keys.header("a") == bearer("second-key")


def test_a_new_worker_gets_its_key_when_it_joins(tmp_path: Path) -> None:
    keys = WorkerKeys(WorkerKeyConfig(directory=tmp_path))
    keys.update([worker("a")])
    assert keys.header("a") is None
    write(tmp_path / "a", "key-a")
    keys.update([worker("a"), worker("b")])
    assert keys.header("a") == bearer("key-a")
    assert keys.header("b") is None


def test_a_key_never_shows(tmp_path: Path) -> None:
    key = read_key(KeyRef(source=KeySource.ENV, name="K"), {"K": SECRET})
    keys = WorkerKeys(WorkerKeyConfig(env="K"), environ={"K": SECRET})
    keys.update([worker("a")])
    for shown in (repr(key), str(key), repr(keys), repr(WorkerKeyConfig(env="K"))):
        assert SECRET not in shown
    with pytest.raises(ConfigError) as caught:
        WorkerKey("two words", origin=KeyRef(source=KeySource.ENV, name="K"))
    assert "two words" not in str(caught.value)


def test_a_static_worker_names_its_own_key_on_the_command_line() -> None:
    static = parse_worker("http://10.0.0.1:8000,id=w1,api-key-from=file:/run/keys/w1")
    assert static.api_key_from == KeyRef(source=KeySource.FILE, name="/run/keys/w1")
    assert KEY_LABEL not in dict(static.record("z", "r").labels)  # never in the store
    with pytest.raises(ConfigError, match="api-key-from: expected file:PATH or env:NAME"):
        parse_worker(f"http://10.0.0.1:8000,api-key-from={SECRET}")

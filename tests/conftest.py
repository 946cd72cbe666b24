"""Fixtures shared by every test directory: a fake clock and real etcd servers.

etcd fixtures FAIL (never skip) when no etcd can be started: a missing dependency must
not turn into a silently green run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gtm.clock import FakeClock
from gtm.errors import GtmError
from gtm.state.etcd_server import EtcdServer


def _start_etcd(data_dir: Path) -> EtcdServer:
    try:
        server = EtcdServer(data_dir, fsync=False)
        server.start()
    except GtmError as exc:
        pytest.fail(f"cannot start etcd for this test: {exc}", pytrace=False)
    return server


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd for the whole session (starting one takes ~1 s). Tests sharing it must
    keep to their own key prefix and must not stop it; see ``own_etcd_server``."""
    server = _start_etcd(tmp_path_factory.mktemp("etcd-session") / "data")
    yield server
    server.stop()


@pytest.fixture
def own_etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A private etcd for tests that stop, kill or restart it."""
    server = _start_etcd(tmp_path / "etcd-data")
    yield server
    server.stop()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()

"""Fixtures shared by every test directory: a fake clock and real etcd servers.

etcd fixtures FAIL (never skip) when no etcd can be started: a missing dependency must
not turn into a silently green run.

Tests that start a whole multi-process deployment (``gtm up --processes``, game days)
are marked ``system`` by where they live (:data:`SYSTEM_PATHS`): ``make test`` runs the
rest and ``make test-system`` runs them, and CI runs both. They are a third of the
suite's time on two cores, and ``make test`` stays a quick loop.
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


#: Where the tests that start a whole deployment live (relative to the repository).
SYSTEM_PATHS = (
    "tests/integration/users_paths/",
    "tests/integration/chaos/scenarios/",
    "tests/integration/chaos/faults/",
    "tests/integration/gtmctl/up/",
    "tests/integration/deploy/",
    "tests/integration/security/test_up_tls.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        try:
            where = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if where.startswith(SYSTEM_PATHS):
            item.add_marker(pytest.mark.system)

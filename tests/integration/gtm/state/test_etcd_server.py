"""EtcdServer against the real etcd binary."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.state.etcd_server import EtcdServer, EtcdStartError
from gtm.state.url import open_store


async def _put_get(url: str, key: str, value: bytes | None) -> bytes | None:
    store = open_store(url, clock=FakeClock(), registry=new_registry())
    try:
        if value is not None:
            await store.put(key, value)
        kv = await store.get(key)
        return None if kv is None else kv.value
    finally:
        await store.aclose()


def test_restart_keeps_ports_and_data(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "data", fsync=False)
    assert server.etcd_url == f"etcd://127.0.0.1:{server.port}"
    assert server.client_url == f"http://127.0.0.1:{server.port}"
    assert server.port != server.peer_port
    with server:
        assert server.running
        assert server.pid is not None
        assert asyncio.run(_put_get(server.etcd_url, "/k", b"v")) == b"v"
        port = server.port
        server.kill()
        assert not server.running
        assert server.pid is None
        server.start()
        assert server.port == port
        assert asyncio.run(_put_get(server.etcd_url, "/k", None)) == b"v"
        server.stop()
        assert not server.running
        server.stop()  # idempotent
        server.start()
        assert asyncio.run(_put_get(server.etcd_url, "/k", None)) == b"v"
    assert not server.running
    assert "etcd" in server.log_tail()


def test_a_failed_start_reports_etcd_log(tmp_path: Path) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data directory should be")
    server = EtcdServer(blocker, fsync=False, startup_timeout=10.0)
    with pytest.raises(EtcdStartError, match="exited with status") as raised:
        server.start()
    assert str(server.log_path) in str(raised.value)
    assert "data" in str(raised.value).split("last lines", 1)[1]
    assert not server.running

"""EtcdStore against real etcd processes: what the contract suite cannot show —
unreachable and silent servers, a server killed mid-watch and restarted, failover."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import aclosing

import pytest

from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.state.etcd import EtcdStore
from gtm.state.etcd_server import EtcdServer
from gtm.state.store import EventType
from gtm.state.url import Endpoint

TIMEOUT = 0.25  # the store's per-call deadline in these tests
EVENT_TIMEOUT = 10.0


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP connections but never says anything."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("port_fixture", ["closed_port", "silent_port"])
async def test_unreachable_etcd_fails_every_call_within_the_timeout(
    port_fixture: str, request: pytest.FixtureRequest
) -> None:
    port: int = request.getfixturevalue(port_fixture)
    registry = new_registry()
    store = EtcdStore([Endpoint("127.0.0.1", port)], timeout=TIMEOUT, registry=registry)
    try:
        for call in (
            lambda: store.get("/k"),
            lambda: store.compare_and_swap("/k", b"v", expected_mod_revision=0),
            lambda: store.keep_alive(1),
            lambda: anext(store.watch("/", start_revision=1)),
        ):
            started = time.monotonic()
            with pytest.raises(StateUnavailable, match=r"127\.0\.0\.1"):
                await call()
            assert time.monotonic() - started < TIMEOUT + 1.0
    finally:
        await store.aclose()
    code = "unavailable" if port_fixture == "closed_port" else "deadline_exceeded"
    labels = {"op": "get", "code": code}
    assert registry.get_sample_value("gtm_state_etcd_errors_total", labels) == 1.0


async def test_watch_fails_when_etcd_dies_and_resumes_after_restart(
    own_etcd_server: EtcdServer,
) -> None:
    server = own_etcd_server
    store = EtcdStore([Endpoint(server.host, server.port)], timeout=TIMEOUT)
    try:
        start = await store.current_revision() + 1
        async with aclosing(store.watch("/r/", start_revision=start)) as watch:
            await store.put("/r/before", b"1")
            batch = await asyncio.wait_for(anext(watch), EVENT_TIMEOUT)
            server.kill()
            with pytest.raises(StateUnavailable):
                await asyncio.wait_for(anext(watch), EVENT_TIMEOUT)
        with pytest.raises(StateUnavailable):
            await store.get("/r/before")
        server.start()  # same data directory, same port
        # The channel reconnects by itself (backoff capped at 2 s): retry like a caller.
        missed = await _retry(lambda: store.put("/r/after", b"2"))
        async with aclosing(store.watch("/r/", start_revision=batch.revision + 1)) as resumed:
            events = (await asyncio.wait_for(anext(resumed), EVENT_TIMEOUT)).events
    finally:
        await store.aclose()
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in events] == [
        (EventType.PUT, "/r/after", missed)
    ]
    assert missed == batch.revision + 1  # the data (and revisions) survived the kill


async def test_calls_fail_over_to_the_next_endpoint(
    etcd_server: EtcdServer, closed_port: int
) -> None:
    store = EtcdStore(
        [Endpoint("127.0.0.1", closed_port), Endpoint(etcd_server.host, etcd_server.port)],
        timeout=TIMEOUT,
    )
    try:
        with pytest.raises(StateUnavailable):
            await store.get("/failover/k")
        assert store.endpoint == Endpoint(etcd_server.host, etcd_server.port)
        revision = await store.put("/failover/k", b"v")
        kv = await store.get("/failover/k")
    finally:
        await store.aclose()
    assert kv is not None
    assert kv.mod_revision == revision


async def _retry(call: object) -> int:
    assert callable(call)
    deadline = time.monotonic() + EVENT_TIMEOUT
    while True:
        try:
            result = await call()
            assert isinstance(result, int)
            return result
        except StateUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # retry pacing against a real server, not a wait

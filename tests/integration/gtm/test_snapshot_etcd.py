"""Static stability against a real etcd: kill it, keep serving, restart, converge.

The watcher runs on a FakeClock so that its backoff and probe happen exactly when the
test says; etcd itself runs in real time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.models import GeoPoint, GpuWorker, Region
from gtm.state import codec, keys
from gtm.state.etcd_server import EtcdServer
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.store import StateStore
from gtm.state.url import open_store
from gtm.tasks import Backoff, TaskSupervisor

pytestmark = [pytest.mark.etcd, pytest.mark.integration]

REGION = Region(
    id="us-east", location=GeoPoint(lat=37.43, lon=-78.66), jurisdiction="US", country="US"
)


def gpu(gpu_id: str) -> GpuWorker:
    return GpuWorker(
        id=gpu_id,
        zone_id="us-east-a",
        region_id="us-east",
        url=f"http://127.0.0.1:9000/{gpu_id}",
        gpu_type="A100-80GB",
        models=("meta-llama/Llama-3.1-8B-Instruct",),
    )


async def put_gpu(store: StateStore, gpu_id: str) -> int:
    return await store.put(keys.gpu("us-east", "us-east-a", gpu_id), codec.encode(gpu(gpu_id)))


@dataclass
class Rig:
    server: EtcdServer
    store: StateStore
    watcher: SnapshotWatcher
    clock: FakeClock
    registry: CollectorRegistry

    def metric(self, name: str) -> float | None:
        value = self.registry.get_sample_value(name, {"component": "gtm"})
        assert value is None or isinstance(value, float)
        return value


@pytest.fixture
async def rig(own_etcd_server: EtcdServer) -> AsyncIterator[Rig]:
    clock = FakeClock()
    store = open_store(own_etcd_server.etcd_url, clock=clock, registry=new_registry(), timeout=1.0)
    await store.put(keys.region("us-east"), codec.encode(REGION))
    await put_gpu(store, "gpu-1")
    registry = new_registry()
    watcher = SnapshotWatcher(
        store,
        clock=clock,
        registry=registry,
        backoff=Backoff(initial=0.5, maximum=0.5),
        rng=random.Random(0),
        probe_interval=1.0,
    )
    rig = Rig(own_etcd_server, store, watcher, clock, registry)
    async with TaskSupervisor(registry=new_registry(), clock=clock) as tasks:
        tasks.spawn("snapshot", watcher.run())
        await asyncio.wait_for(watcher.wait_ready(), 10)
        yield rig
    await store.aclose()


async def wait_until_stale(rig: Rig) -> None:
    """Either the broken watch stream or the next probe notices the outage."""
    for _ in range(100):
        if rig.watcher.stale:
            return
        await rig.clock.advance(0.5)
        try:
            await asyncio.wait_for(rig.watcher.wait_stale(True), 0.2)
        except TimeoutError:
            continue
    raise AssertionError("watcher never noticed that etcd was down")


async def converge(rig: Rig, revision: int) -> None:
    """Let fake time pass (backoff, probes) until the watcher is in sync at ``revision``."""
    for _ in range(200):
        if rig.watcher.current.revision >= revision and not rig.watcher.stale:
            return
        await rig.clock.advance(0.5)
        try:
            await asyncio.wait_for(rig.watcher.wait_for_revision(revision), 0.2)
        except TimeoutError:
            continue
    raise AssertionError(f"watcher did not converge to revision {revision}")


async def test_killed_etcd_keeps_last_snapshot_then_converges_after_restart(rig: Rig) -> None:
    served = rig.watcher.current
    assert set(served.gpus) == {"gpu-1"}

    await asyncio.to_thread(rig.server.kill)
    await wait_until_stale(rig)
    assert rig.watcher.current is served, "the last snapshot is still served"
    assert rig.metric("gtm_snapshot_stale") == 1.0
    staleness_before = rig.watcher.staleness_seconds()
    await rig.clock.advance(2.0)
    assert rig.watcher.staleness_seconds() >= staleness_before + 2.0

    await asyncio.to_thread(rig.server.start)  # same data dir, same port
    # Written by a client of its own: the watcher's channel may still be in gRPC's
    # reconnect backoff (real time, up to a second or more), and a put on it would fail
    # fast with UNAVAILABLE although etcd is healthy. The watcher's own way back is what
    # this test is about (converge, below).
    writer = open_store(rig.server.etcd_url, clock=rig.clock, registry=new_registry(), timeout=5.0)
    try:
        revision = await put_gpu(writer, "gpu-2")
    finally:
        await writer.aclose()
    assert revision > served.revision, "etcd kept its data across the crash"
    await converge(rig, revision)
    snap = rig.watcher.current
    assert snap.revision >= revision
    assert set(snap.gpus) == {"gpu-1", "gpu-2"}
    assert not rig.watcher.stale
    assert rig.metric("gtm_snapshot_relists_total") == 1.0, "resumed from its revision"
    reconnects = rig.metric("gtm_snapshot_reconnects_total")
    assert reconnects is not None
    assert reconnects >= 1.0


async def test_compaction_while_disconnected_forces_a_relist(rig: Rig) -> None:
    await asyncio.to_thread(rig.server.kill)
    await wait_until_stale(rig)
    await asyncio.to_thread(rig.server.start)

    # While the watcher sits in its backoff (fake time does not move), the fleet changes
    # and the history it would resume from is compacted away.
    await rig.store.delete(keys.gpu("us-east", "us-east-a", "gpu-1"))
    revision = await put_gpu(rig.store, "gpu-3")
    await rig.store.compact(revision)

    await converge(rig, revision)
    snap = rig.watcher.current
    assert snap.revision >= revision
    assert set(snap.gpus) == {"gpu-3"}, "the deleted worker is gone after the re-list"
    assert rig.metric("gtm_snapshot_relists_total") == 2.0

"""SnapshotWatcher over the embedded store, on a fake clock.

Store outages are simulated by :class:`gtm.testing.outage.OutageStore`: while it is
"down", calls raise StateUnavailable and open watches end with it — the same signals
EtcdStore gives (the real-etcd version of these tests is in
tests/integration/gtm/test_snapshot_etcd.py).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.models import (
    Drain,
    DrainTarget,
    GeoPoint,
    GpuWorker,
    Region,
    RegionSummary,
    Zone,
)
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtm.state.snapshot import SnapshotWatcher
from gtm.tasks import Backoff, TaskSupervisor
from gtm.testing.outage import OutageStore

REGION = Region(
    id="eu-west", location=GeoPoint(lat=53.35, lon=-6.26), jurisdiction="EU", country="IE"
)
ZONE = Zone(id="eu-west-a", region_id="eu-west")


def gpu(gpu_id: str, zone_id: str = "eu-west-a") -> GpuWorker:
    return GpuWorker(
        id=gpu_id,
        zone_id=zone_id,
        region_id="eu-west",
        url=f"http://127.0.0.1:9000/{gpu_id}",
        gpu_type="H100",
        models=("meta-llama/Llama-3.1-8B-Instruct",),
    )


async def put_gpu(
    store: OutageStore[MemoryStore] | MemoryStore, record: GpuWorker, lease: int = 0
) -> int:
    key = keys.gpu(record.region_id, record.zone_id, record.id)
    return await store.put(key, codec.encode(record), lease=lease)


@pytest.fixture
async def fleet(
    fake_clock: FakeClock,
) -> AsyncIterator[tuple[OutageStore[MemoryStore], SnapshotWatcher]]:
    store = OutageStore(MemoryStore(fake_clock))
    await store.put(keys.region("eu-west"), codec.encode(REGION))
    await store.put(keys.zone("eu-west", "eu-west-a"), codec.encode(ZONE))
    await put_gpu(store, gpu("gpu-1"))
    registry = new_registry()
    watcher = SnapshotWatcher(
        store,
        clock=fake_clock,
        registry=registry,
        backoff=Backoff(initial=1.0, maximum=1.0),
        rng=random.Random(0),
        probe_interval=1.0,
    )
    watcher.registry = registry  # type: ignore[attr-defined]  # handy in tests
    async with TaskSupervisor(registry=new_registry(), clock=fake_clock) as tasks:
        tasks.spawn("snapshot", watcher.run())
        await asyncio.wait_for(watcher.wait_ready(), 5)
        yield store, watcher


def sample(watcher: SnapshotWatcher, name: str) -> float | None:
    registry = watcher.registry  # type: ignore[attr-defined]
    value = registry.get_sample_value(name, {"component": "gtm"})
    assert value is None or isinstance(value, float)
    return value


async def test_first_listing_builds_the_snapshot(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher],
) -> None:
    store, watcher = fleet
    snap = watcher.current
    assert snap.revision == await store.current_revision()
    assert snap.regions == {"eu-west": REGION}
    assert snap.zones_by_region["eu-west"] == (ZONE,)
    assert [g.id for g in snap.gpus_by_zone["eu-west-a"]] == ["gpu-1"]
    assert not watcher.stale
    assert sample(watcher, "gtm_snapshot_stale") == 0.0
    assert sample(watcher, "gtm_snapshot_revision") == snap.revision


async def test_changes_swap_in_a_new_snapshot_sharing_untouched_maps(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher],
) -> None:
    store, watcher = fleet
    before = watcher.current
    revision = await put_gpu(store, gpu("gpu-2"))
    after = await asyncio.wait_for(watcher.wait_for_revision(revision), 5)
    assert set(after.gpus) == {"gpu-1", "gpu-2"}
    assert set(before.gpus) == {"gpu-1"}, "old snapshot must not change under a reader"
    assert after.regions is before.regions, "untouched kinds are shared, not copied"

    revision_del = await store.delete(keys.gpu("eu-west", "eu-west-a", "gpu-1"))
    assert revision_del
    latest = await asyncio.wait_for(watcher.wait_for_revision(await store.current_revision()), 5)
    assert set(latest.gpus) == {"gpu-2"}


async def test_lease_expiry_removes_a_worker(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher], fake_clock: FakeClock
) -> None:
    store, watcher = fleet
    lease = await store.grant_lease(2.0)
    revision = await put_gpu(store, gpu("gpu-leased"), lease=lease.id)
    assert "gpu-leased" in (await watcher.wait_for_revision(revision)).gpus
    await fake_clock.advance(2.5)
    await store.inner.expire_due()
    gone = await asyncio.wait_for(watcher.wait_for_revision(revision + 1), 5)
    assert "gpu-leased" not in gone.gpus


async def test_invalid_and_mismatched_records_are_skipped_and_counted(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher],
) -> None:
    store, watcher = fleet
    await store.put(keys.gpu("eu-west", "eu-west-a", "broken"), b"{not json")
    # A valid record under the wrong key: its ids say another zone.
    elsewhere = gpu("gpu-9", zone_id="eu-west-b")
    revision = await store.put(keys.gpu("eu-west", "eu-west-a", "gpu-9"), codec.encode(elsewhere))
    snap = await asyncio.wait_for(watcher.wait_for_revision(revision), 5)
    assert set(snap.gpus) == {"gpu-1"}
    assert watcher.invalid_keys == {
        keys.gpu("eu-west", "eu-west-a", "broken"),
        keys.gpu("eu-west", "eu-west-a", "gpu-9"),
    }
    assert sample(watcher, "gtm_snapshot_invalid_records") == 2.0
    # Fixing the value clears it.
    revision = await put_gpu(store, gpu("broken"))
    snap = await asyncio.wait_for(watcher.wait_for_revision(revision), 5)
    assert "broken" in snap.gpus
    assert sample(watcher, "gtm_snapshot_invalid_records") == 1.0


async def test_drains_and_summaries_are_followed(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher],
) -> None:
    store, watcher = fleet
    drain = Drain(target=DrainTarget.ZONE, id="eu-west-a", reason="maintenance")
    await store.put(keys.drain(DrainTarget.ZONE, "eu-west-a"), codec.encode(drain))
    summary = RegionSummary(region_id="eu-west", published_at=5.0, zones_total=2)
    revision = await store.put(keys.region_summary("eu-west"), codec.encode(summary))
    snap = await asyncio.wait_for(watcher.wait_for_revision(revision), 5)
    assert snap.is_drained(DrainTarget.ZONE, "eu-west-a")
    assert not snap.is_drained(DrainTarget.REGION, "eu-west")
    assert snap.region_summaries["eu-west"] == summary


async def test_outage_keeps_last_snapshot_marked_stale_then_resumes_without_relist(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher], fake_clock: FakeClock
) -> None:
    store, watcher = fleet
    served = watcher.current
    store.down = True
    await asyncio.wait_for(watcher.wait_stale(True), 5)
    assert watcher.current is served, "static stability: the last snapshot stays in force"
    assert sample(watcher, "gtm_snapshot_stale") == 1.0
    await fake_clock.advance_until(lambda: watcher.staleness_seconds() >= 3.0)
    retries = sample(watcher, "gtm_snapshot_reconnects_total")
    assert retries is not None
    assert retries >= 3.0, "backoff ≤ 1 s: at least three failed retries in 3 s"
    assert sample(watcher, "gtm_snapshot_staleness_seconds") == watcher.staleness_seconds()

    store.down = False
    revision = await put_gpu(store, gpu("gpu-after"))
    # The backoff ends; the watch resumes from the old revision.
    await fake_clock.advance_until(lambda: watcher.current.revision >= revision)
    snap = watcher.current
    assert "gpu-after" in snap.gpus
    assert not watcher.stale
    assert sample(watcher, "gtm_snapshot_relists_total") == 1.0, "resumed, not re-listed"


async def test_quiet_reconnect_clears_staleness_through_the_probe(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher], fake_clock: FakeClock
) -> None:
    _, watcher = fleet
    store = fleet[0]
    store.down = True
    await asyncio.wait_for(watcher.wait_stale(True), 5)
    store.down = False
    # No writes: only the probe can tell that the store is back.
    await fake_clock.advance_until(lambda: not watcher.stale)
    assert watcher.staleness_seconds() == 0.0


async def test_compaction_while_away_forces_a_relist_that_drops_deleted_keys(
    fleet: tuple[OutageStore[MemoryStore], SnapshotWatcher], fake_clock: FakeClock
) -> None:
    store, watcher = fleet
    store.down = True
    await asyncio.wait_for(watcher.wait_stale(True), 5)
    store.down = False  # back, but the watcher is still in its backoff sleep
    await store.delete(keys.gpu("eu-west", "eu-west-a", "gpu-1"))
    revision = await put_gpu(store, gpu("gpu-new"))
    await store.compact(revision)
    await fake_clock.advance_until(lambda: watcher.current.revision >= revision)
    assert set(watcher.current.gpus) == {"gpu-new"}
    assert sample(watcher, "gtm_snapshot_relists_total") == 2.0

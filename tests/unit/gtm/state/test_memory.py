"""MemoryStore-specific behaviour (the shared contract is in tests/contract/): slow
watchers, history bounds, lease expiry on the injected clock, metrics."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import pytest

from gtm.clock import FakeClock
from gtm.errors import CompactedError, LeaseNotFound, StateError
from gtm.metrics import new_registry
from gtm.state.memory import WATCH_BATCH_MAX_EVENTS, MemoryStore
from gtm.state.store import EventType
from gtm.tasks import TaskSupervisor


async def test_a_slow_watcher_never_blocks_writers_and_ends_with_compacted(
    fake_clock: FakeClock,
) -> None:
    registry = new_registry()
    store = MemoryStore(fake_clock, registry, history_limit=8)
    start = await store.current_revision() + 1
    async with (
        aclosing(store.watch("/k/", start_revision=start)) as slow,
        aclosing(store.watch("/k/", start_revision=start)) as fast,
    ):
        await store.put("/k/0", b"0")
        assert [e.kv.key for e in (await anext(slow)).events] == ["/k/0"]
        assert [e.kv.key for e in (await anext(fast)).events] == ["/k/0"]
        for i in range(1, 40):  # the slow watcher reads nothing meanwhile
            revision = await store.put(f"/k/{i}", b"")
            batch = await anext(fast)
            assert [(e.kv.key, e.kv.mod_revision) for e in batch.events] == [(f"/k/{i}", revision)]
        with pytest.raises(CompactedError) as raised:
            await anext(slow)
    assert raised.value.requested_revision == start + 1
    assert raised.value.compact_revision == store.oldest_revision
    assert store.oldest_revision > start + 1
    assert registry.get_sample_value("gtm_state_memory_watchers_compacted_total") == 1.0


async def test_history_is_bounded_by_auto_compaction(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock, history_limit=100)
    for i in range(1000):
        await store.put("/k", str(i).encode())
    revision = await store.current_revision()
    assert revision - 125 <= store.oldest_revision <= revision - 99  # trimmed in chunks
    async with aclosing(store.watch("/k", start_revision=revision - 99)) as watch:
        batch = await anext(watch)
    assert len(batch.events) == 100
    assert batch.revision == revision


async def test_catching_up_is_batched_at_revision_boundaries(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    lease = await store.grant_lease(10)
    start = await store.current_revision() + 1
    await store.put("/k/leased-a", b"", lease=lease.id)
    await store.put("/k/leased-b", b"", lease=lease.id)
    for i in range(WATCH_BATCH_MAX_EVENTS - 3):
        await store.put(f"/k/{i:05}", b"")
    await store.revoke_lease(lease.id)  # one revision, two events: would overflow batch 1
    async with aclosing(store.watch("/k/", start_revision=start)) as watch:
        first, second = await anext(watch), await anext(watch)
    assert len(first.events) == WATCH_BATCH_MAX_EVENTS - 1
    assert [e.type for e in second.events] == [EventType.DELETE, EventType.DELETE]
    assert second.revision == await store.current_revision()


async def test_leases_expire_on_the_injected_clock_without_any_call(fake_clock: FakeClock) -> None:
    registry = new_registry()
    store = MemoryStore(fake_clock, registry)
    lease = await store.grant_lease(2)
    revision = await store.put("/gpu", b"up", lease=lease.id)
    async with (
        TaskSupervisor(registry=new_registry(), clock=fake_clock) as tasks,
        aclosing(store.watch("/", start_revision=revision + 1)) as watch,
    ):
        store.run_expiry(tasks)
        await fake_clock.advance(1.9)
        assert registry.get_sample_value("gtm_state_memory_keys") == 1.0
        await fake_clock.advance(0.6)  # past the TTL and the next expiry check
        # Only the expiry loop ran; the watch delivers the DELETE it made.
        batch = await asyncio.wait_for(anext(watch), 5.0)
    assert [(e.type, e.kv.key) for e in batch.events] == [(EventType.DELETE, "/gpu")]
    assert registry.get_sample_value("gtm_state_memory_expired_leases_total") == 1.0
    assert registry.get_sample_value("gtm_state_memory_keys") == 0.0
    assert registry.get_sample_value("gtm_state_memory_leases") == 0.0


async def test_expiry_is_also_lazy_on_every_call(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    lease = await store.grant_lease(3)
    await store.put("/a", b"", lease=lease.id)
    fake_clock.advance_nowait(3.0)  # no expiry loop, no sleeper woken
    assert await store.get("/a") is None
    assert (await store.range("/")).kvs == ()
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(lease.id)


async def test_keep_alive_extends_a_lease(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    lease = await store.grant_lease(2)
    await store.put("/a", b"", lease=lease.id)
    for _ in range(5):
        fake_clock.advance_nowait(1.5)
        assert await store.keep_alive(lease.id) == 2.0
    assert await store.get("/a") is not None
    fake_clock.advance_nowait(2.0)
    assert await store.get("/a") is None


async def test_moving_a_key_to_another_lease_detaches_it_from_the_first(
    fake_clock: FakeClock,
) -> None:
    store = MemoryStore(fake_clock)
    short, long = await store.grant_lease(1), await store.grant_lease(10)
    await store.put("/a", b"1", lease=short.id)
    await store.put("/a", b"2", lease=long.id)
    await store.put("/b", b"1", lease=short.id)
    await store.put("/b", b"2")  # no lease any more
    fake_clock.advance_nowait(5.0)
    assert [(kv.key, kv.lease) for kv in (await store.range("/")).kvs] == [
        ("/a", long.id),
        ("/b", 0),
    ]


async def test_metrics_count_keys_leases_and_watchers(fake_clock: FakeClock) -> None:
    registry = new_registry()
    store = MemoryStore(fake_clock, registry)
    await store.grant_lease(5)
    revision = await store.put("/a", b"")
    async with aclosing(store.watch("/", start_revision=revision)) as watch:
        await anext(watch)
        assert registry.get_sample_value("gtm_state_memory_watchers") == 1.0
    assert registry.get_sample_value("gtm_state_memory_watchers") == 0.0
    assert registry.get_sample_value("gtm_state_memory_keys") == 1.0
    assert registry.get_sample_value("gtm_state_memory_leases") == 1.0
    assert registry.get_sample_value("gtm_state_memory_revision") == revision


async def test_a_watch_from_now_starts_after_the_current_revision(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    await store.put("/before", b"")
    watch = store.watch("/", start_revision=0)
    async with TaskSupervisor(registry=new_registry(), clock=fake_clock) as tasks:
        first = tasks.spawn("first-batch", anext(watch))
        await fake_clock.settle()  # the watch is now waiting
        after = await store.put("/after", b"")
        batch = await asyncio.wait_for(first, 5.0)
    await watch.aclose()
    assert [(e.kv.key, e.kv.mod_revision) for e in batch.events] == [("/after", after)]


async def test_constructor_and_compact_reject_nonsense(fake_clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="history_limit"):
        MemoryStore(fake_clock, history_limit=0)
    store = MemoryStore(fake_clock)
    with pytest.raises(StateError, match="cannot compact"):
        await store.compact(5)

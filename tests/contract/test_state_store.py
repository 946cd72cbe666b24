"""One contract suite for every StateStore: the embedded MemoryStore and EtcdStore on a
real etcd. Both must behave identically, so the memory store is a verified fake.

Only lease expiry needs store-specific mechanics, and it lives in the harness: the
memory store's clock is a FakeClock the harness advances; etcd's leases expire in real
time (TTL 1 s). Either way the test then awaits the DELETE event with a bounded timeout.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

import pytest

from gtm.clock import FakeClock
from gtm.errors import CompactedError, LeaseNotFound, StateError, StateUnavailable
from gtm.metrics import new_registry
from gtm.state.etcd import EtcdStore
from gtm.state.etcd_server import EtcdServer
from gtm.state.memory import LEASE_EXPIRY_INTERVAL, MemoryStore
from gtm.state.store import EventType, Lease, StateStore, WatchBatch, WatchEvent
from gtm.state.url import Endpoint
from gtm.tasks import TaskSupervisor

#: Upper bound on waiting for a watch event. Events arrive in milliseconds; an etcd
#: lease expiry takes ~1.5 s (1 s TTL + etcd's 500 ms expiry check).
EVENT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Harness:
    store: StateStore
    prefix: str  # unique per test, so tests can share one etcd
    let_lease_expire: Callable[[Lease], Awaitable[None]]

    def key(self, name: str) -> str:
        return self.prefix + name


@pytest.fixture(params=["memory", "etcd"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    prefix = f"/contract/{uuid.uuid4().hex[:12]}/"
    if request.param == "memory":
        clock = FakeClock()
        memory = MemoryStore(clock, new_registry())

        async def advance_past(lease: Lease) -> None:
            await clock.advance(lease.ttl + LEASE_EXPIRY_INTERVAL)

        async with TaskSupervisor(registry=new_registry(), clock=clock) as tasks:
            memory.run_expiry(tasks)
            yield Harness(memory, prefix, advance_past)
            await memory.aclose()
    else:
        server: EtcdServer = request.getfixturevalue("etcd_server")
        etcd = EtcdStore([Endpoint(server.host, server.port)], registry=new_registry())

        async def real_time_passes(lease: Lease) -> None:
            return None  # the test awaits the DELETE event, which comes after the TTL

        yield Harness(etcd, prefix, real_time_passes)
        await etcd.aclose()


async def next_batch(watch: AsyncGenerator[WatchBatch, None]) -> WatchBatch:
    return await asyncio.wait_for(anext(watch), EVENT_TIMEOUT)


async def next_events(watch: AsyncGenerator[WatchBatch, None], count: int) -> list[WatchEvent]:
    """At least ``count`` events (whole batches), checking batch ordering on the way."""
    events: list[WatchEvent] = []
    last = 0
    while len(events) < count:
        batch = await next_batch(watch)
        assert batch.events, "batches are never empty"
        assert batch.revision > last
        assert batch.revision == max(e.kv.mod_revision for e in batch.events)
        last = batch.revision
        events.extend(batch.events)
    return events


def summary(events: list[WatchEvent]) -> list[tuple[EventType, str, bytes, int]]:
    return [(e.type, e.kv.key, e.kv.value, e.kv.mod_revision) for e in events]


# ---------------------------------------------------------------- key-value


async def test_get_put_delete(harness: Harness) -> None:
    store, key = harness.store, harness.key("k")
    assert await store.get(key) is None
    first = await store.put(key, b"v1")
    kv = await store.get(key)
    assert kv is not None
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (
        key, b"v1", first, first, 1, 0,
    )  # fmt: skip
    second = await store.put(key, b"v2")
    kv = await store.get(key)
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"v2", first, second, 2)
    assert await store.delete(key) is True
    assert await store.get(key) is None
    assert await store.delete(key) is False
    recreated = await store.put(key, b"v3")
    kv = await store.get(key)
    assert kv is not None
    assert (kv.create_revision, kv.version) == (recreated, 1)  # a new life starts at version 1


async def test_revisions_are_store_wide_and_increase_by_one_per_write(harness: Harness) -> None:
    store = harness.store
    start = await store.current_revision()
    revisions = [
        await store.put(harness.key("a"), b"1"),
        await store.put(harness.key("b"), b"1"),
        await store.put(harness.key("a"), b"2"),
    ]
    assert await store.delete(harness.key("b"))
    assert revisions == [start + 1, start + 2, start + 3]
    assert await store.current_revision() == start + 4
    assert await store.delete(harness.key("missing")) is False
    assert await store.current_revision() == start + 4  # no change, no revision


async def test_range_is_sorted_consistent_and_respects_prefix_boundaries(harness: Harness) -> None:
    store = harness.store
    names = ["a/bc", "a/b/y", "a/b", "b", "a/b/x", "a/a"]
    for name in names:
        await store.put(harness.key(name), name.encode())
    result = await store.range(harness.prefix)
    assert [kv.key for kv in result.kvs] == [harness.key(n) for n in sorted(names)]
    assert result.revision == await store.current_revision()
    assert all(kv.mod_revision <= result.revision for kv in result.kvs)
    # A prefix ending in "/" is a directory: "/a/b/" does not match "/a/bc" or "/a/b".
    directory = await store.range(harness.key("a/b/"))
    assert [kv.key for kv in directory.kvs] == [harness.key("a/b/x"), harness.key("a/b/y")]
    # A bare prefix is a plain string prefix.
    bare = await store.range(harness.key("a/b"))
    assert [kv.key for kv in bare.kvs] == [
        harness.key(n) for n in ["a/b", "a/b/x", "a/b/y", "a/bc"]
    ]
    empty = await store.range(harness.key("zzz/"))
    assert empty.kvs == ()
    assert empty.revision == result.revision


async def test_range_orders_unicode_keys_by_utf8_bytes(harness: Harness) -> None:
    names = ["z", "é", "a", "日本", "ä", "Z"]
    for name in names:
        await harness.store.put(harness.key(name), b"")
    result = await harness.store.range(harness.prefix)
    expected = sorted((harness.key(n) for n in names), key=lambda k: k.encode())
    assert [kv.key for kv in result.kvs] == expected


async def test_empty_keys_are_refused(harness: Harness) -> None:
    with pytest.raises(ValueError, match="empty"):
        await harness.store.put("", b"x")
    with pytest.raises(ValueError, match="empty"):
        await harness.store.get("")


# ---------------------------------------------------------------- compare-and-swap


async def test_compare_and_swap_creates_only_if_absent(harness: Harness) -> None:
    store, key = harness.store, harness.key("owner")
    created = await store.compare_and_swap(key, b"me", expected_mod_revision=0)
    assert created.succeeded
    assert created.revision == await store.current_revision()
    lost = await store.compare_and_swap(key, b"you", expected_mod_revision=0)
    assert not lost.succeeded
    assert lost.revision == created.revision  # a failed compare writes nothing
    kv = await store.get(key)
    assert kv is not None
    assert (kv.value, kv.mod_revision) == (b"me", created.revision)


async def test_compare_and_swap_on_mod_revision_is_a_fencing_token(harness: Harness) -> None:
    store, key = harness.store, harness.key("owner")
    first = await store.put(key, b"a")
    swapped = await store.compare_and_swap(key, b"b", expected_mod_revision=first)
    assert swapped.succeeded
    assert swapped.revision == first + 1
    stale = await store.compare_and_swap(key, b"c", expected_mod_revision=first)
    assert not stale.succeeded
    assert stale.revision == swapped.revision
    kv = await store.get(key)
    assert kv is not None
    assert (kv.value, kv.version) == (b"b", 2)


async def test_compare_and_delete(harness: Harness) -> None:
    store, key = harness.store, harness.key("k")
    revision = await store.put(key, b"v")
    wrong = await store.compare_and_delete(key, expected_mod_revision=revision - 1)
    assert not wrong.succeeded
    assert await store.get(key) is not None
    right = await store.compare_and_delete(key, expected_mod_revision=revision)
    assert right.succeeded
    assert right.revision == revision + 1
    assert await store.get(key) is None
    absent = await store.compare_and_delete(key, expected_mod_revision=0)
    assert absent.succeeded  # "must be absent" holds; nothing to delete, no new revision
    assert absent.revision == right.revision


# ---------------------------------------------------------------- leases


async def test_lease_keys_carry_the_lease_and_keep_alive_returns_the_ttl(harness: Harness) -> None:
    store = harness.store
    lease = await store.grant_lease(5)
    assert lease.ttl == 5.0
    await store.put(harness.key("a"), b"1", lease=lease.id)
    kv = await store.get(harness.key("a"))
    assert kv is not None
    assert kv.lease == lease.id
    assert await store.keep_alive(lease.id) == 5.0
    await store.revoke_lease(lease.id)


async def test_lease_ttl_is_rounded_up_to_whole_seconds(harness: Harness) -> None:
    store = harness.store
    assert (await store.grant_lease(0.2)).ttl == 1.0
    assert (await store.grant_lease(2.5)).ttl == 3.0
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="positive"):
            await store.grant_lease(bad)


async def test_revoke_deletes_keys_in_one_revision_and_watchers_see_it(harness: Harness) -> None:
    store = harness.store
    lease = await store.grant_lease(30)
    await store.put(harness.key("b"), b"1", lease=lease.id)
    last = await store.put(harness.key("a"), b"1", lease=lease.id)
    await store.put(harness.key("c"), b"no lease")
    async with aclosing(store.watch(harness.prefix, start_revision=last + 2)) as watch:
        await store.revoke_lease(lease.id)
        batch = await next_batch(watch)
    deletes = [(e.type, e.kv.key, e.kv.value) for e in batch.events]
    assert deletes == [
        (EventType.DELETE, harness.key("a"), b""),
        (EventType.DELETE, harness.key("b"), b""),
    ]
    assert {e.kv.mod_revision for e in batch.events} == {last + 2}
    assert [kv.key for kv in (await store.range(harness.prefix)).kvs] == [harness.key("c")]
    await store.revoke_lease(lease.id)  # already gone: no error
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(lease.id)


async def test_lease_expiry_deletes_keys_and_watchers_see_it(harness: Harness) -> None:
    store = harness.store
    lease = await store.grant_lease(1)
    revision = await store.put(harness.key("leased"), b"1", lease=lease.id)
    async with aclosing(store.watch(harness.prefix, start_revision=revision + 1)) as watch:
        await harness.let_lease_expire(lease)
        batch = await next_batch(watch)
    assert [(e.type, e.kv.key) for e in batch.events] == [(EventType.DELETE, harness.key("leased"))]
    assert await store.get(harness.key("leased")) is None
    with pytest.raises(LeaseNotFound) as raised:
        await store.keep_alive(lease.id)
    assert raised.value.lease_id == lease.id
    with pytest.raises(LeaseNotFound):
        await store.put(harness.key("late"), b"1", lease=lease.id)


async def test_writes_with_an_unknown_lease_are_refused(harness: Harness) -> None:
    store, unknown = harness.store, 0x5EED_CAFE
    with pytest.raises(LeaseNotFound):
        await store.put(harness.key("k"), b"1", lease=unknown)
    with pytest.raises(LeaseNotFound):
        await store.compare_and_swap(harness.key("k"), b"1", expected_mod_revision=0, lease=unknown)
    # The lease is checked only on the branch taken: a failed compare is just a failure.
    failed = await store.compare_and_swap(
        harness.key("k"), b"1", expected_mod_revision=12345, lease=unknown
    )
    assert not failed.succeeded
    assert await store.get(harness.key("k")) is None
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(unknown)
    await store.revoke_lease(unknown)  # no error


# ---------------------------------------------------------------- watch


async def test_watch_from_an_old_revision_replays_history_in_order(harness: Harness) -> None:
    store = harness.store
    first = await store.put(harness.key("a"), b"1")
    await store.put(harness.key("b"), b"1")
    await store.put(harness.key("a"), b"2")
    await store.delete(harness.key("b"))
    await store.put(harness.prefix.rstrip("/") + "-sibling", b"outside the prefix")
    async with aclosing(store.watch(harness.prefix, start_revision=first)) as watch:
        events = await next_events(watch, 4)
    assert summary(events) == [
        (EventType.PUT, harness.key("a"), b"1", first),
        (EventType.PUT, harness.key("b"), b"1", first + 1),
        (EventType.PUT, harness.key("a"), b"2", first + 2),
        (EventType.DELETE, harness.key("b"), b"", first + 3),
    ]
    assert events[2].kv.version == 2
    assert events[2].kv.create_revision == first


async def test_range_then_watch_from_next_revision_sees_exactly_later_changes(
    harness: Harness,
) -> None:
    # The snapshot watcher's pattern: list at R, then watch from R + 1.
    store = harness.store
    await store.put(harness.key("a"), b"1")
    await store.put(harness.key("b"), b"1")
    listed = await store.range(harness.prefix)
    async with aclosing(store.watch(harness.prefix, start_revision=listed.revision + 1)) as watch:
        put_c = await store.put(harness.key("c"), b"1")
        await store.delete(harness.key("a"))
        events = await next_events(watch, 2)
    assert summary(events) == [
        (EventType.PUT, harness.key("c"), b"1", put_c),
        (EventType.DELETE, harness.key("a"), b"", put_c + 1),
    ]


async def test_watch_resumes_from_the_last_batch_revision(harness: Harness) -> None:
    store = harness.store
    start = await store.current_revision() + 1
    async with aclosing(store.watch(harness.prefix, start_revision=start)) as watch:
        await store.put(harness.key("seen"), b"0")
        batch = await next_batch(watch)
    assert [e.kv.key for e in batch.events] == [harness.key("seen")]
    missed = await store.put(harness.key("while-away"), b"1")
    async with aclosing(store.watch(harness.prefix, start_revision=batch.revision + 1)) as resumed:
        events = await next_events(resumed, 1)
    assert summary(events) == [(EventType.PUT, harness.key("while-away"), b"1", missed)]


async def test_resuming_from_any_batch_revision_misses_nothing_while_catching_up(
    harness: Harness,
) -> None:
    # More revisions than either store puts in one batch while catching up (1000).
    store, writes = harness.store, 1_100
    start = await store.current_revision() + 1
    for chunk in range(0, writes, 100):
        await asyncio.gather(
            *(store.put(harness.key(f"{i:04}"), b"") for i in range(chunk, chunk + 100))
        )
    async with aclosing(store.watch(harness.prefix, start_revision=start)) as watch:
        first = await next_batch(watch)
    assert len(first.events) < writes
    revisions = [e.kv.mod_revision for e in first.events]
    async with aclosing(store.watch(harness.prefix, start_revision=first.revision + 1)) as watch:
        revisions += [e.kv.mod_revision for e in await next_events(watch, writes - len(revisions))]
    assert revisions == list(range(start, start + writes))


async def test_watch_from_a_compacted_revision_raises_compacted(harness: Harness) -> None:
    store = harness.store
    first = await store.put(harness.key("a"), b"1")
    await store.put(harness.key("a"), b"2")
    kept = await store.put(harness.key("a"), b"3")
    await store.compact(kept)
    async with aclosing(store.watch(harness.prefix, start_revision=first)) as watch:
        with pytest.raises(CompactedError) as raised:
            await next_batch(watch)
    assert (raised.value.requested_revision, raised.value.compact_revision) == (first, kept)
    async with aclosing(store.watch(harness.prefix, start_revision=kept)) as watch:
        events = await next_events(watch, 1)  # the compaction revision itself is kept
    assert summary(events) == [(EventType.PUT, harness.key("a"), b"3", kept)]
    await store.compact(kept - 1)  # at or below the compaction point: nothing to do
    with pytest.raises(StateError, match="revision") as future:
        await store.compact(kept + 1000)
    assert not isinstance(future.value, StateUnavailable)


async def test_multiple_watchers_each_see_their_prefix(harness: Harness) -> None:
    store = harness.store
    start = await store.current_revision() + 1
    async with (
        aclosing(store.watch(harness.prefix, start_revision=start)) as everything,
        aclosing(store.watch(harness.prefix, start_revision=start)) as again,
        aclosing(store.watch(harness.key("gpus/"), start_revision=start)) as gpus,
    ):
        await store.put(harness.key("regions/eu"), b"r")
        gpu = await store.put(harness.key("gpus/g1"), b"g")
        await store.delete(harness.key("regions/eu"))
        all_events = summary(await next_events(everything, 3))
        assert summary(await next_events(again, 3)) == all_events
        assert summary(await next_events(gpus, 1)) == [
            (EventType.PUT, harness.key("gpus/g1"), b"g", gpu)
        ]
    assert [key for _, key, _, _ in all_events] == [
        harness.key("regions/eu"), harness.key("gpus/g1"), harness.key("regions/eu"),
    ]  # fmt: skip


async def test_aclose_ends_open_watches(harness: Harness) -> None:
    store = harness.store
    start = await store.current_revision() + 1
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in store.watch(harness.prefix, start_revision=start):
            seen.set()

    async with TaskSupervisor(registry=new_registry()) as tasks:
        consumer = tasks.spawn("consumer", consume())
        await store.put(harness.key("tick"), b"")
        await asyncio.wait_for(seen.wait(), EVENT_TIMEOUT)  # the watch is open
        await store.aclose()
        await asyncio.wait_for(consumer, EVENT_TIMEOUT)  # and has ended, without an error
    with pytest.raises(StateUnavailable):
        await store.get(harness.key("tick"))


async def test_cancelling_a_watching_task_leaves_the_store_usable(harness: Harness) -> None:
    store = harness.store
    start = await store.current_revision() + 1
    seen = asyncio.Event()

    async def consume() -> None:
        async for _ in store.watch(harness.prefix, start_revision=start):
            seen.set()

    async with TaskSupervisor(registry=new_registry()) as tasks:
        consumer = tasks.spawn("consumer", consume())
        await store.put(harness.key("a"), b"")
        await asyncio.wait_for(seen.wait(), EVENT_TIMEOUT)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
    revision = await store.put(harness.key("b"), b"")
    async with aclosing(store.watch(harness.prefix, start_revision=revision)) as watch:
        assert summary(await next_events(watch, 1)) == [
            (EventType.PUT, harness.key("b"), b"", revision)
        ]


# ---------------------------------------------------------------- values


async def test_unicode_keys_and_binary_values_round_trip(harness: Harness) -> None:
    store = harness.store
    key = harness.key("ключ/🚀")
    value = bytes(range(256)) * 4
    revision = await store.put(key, value)
    kv = await store.get(key)
    assert kv is not None
    assert (kv.key, kv.value) == (key, value)
    assert [(k.key, k.value) for k in (await store.range(harness.key("ключ/"))).kvs] == [
        (key, value)
    ]
    async with aclosing(store.watch(harness.key("ключ/"), start_revision=revision)) as watch:
        assert summary(await next_events(watch, 1)) == [(EventType.PUT, key, value, revision)]


async def test_large_values_round_trip_and_oversized_ones_are_refused(harness: Harness) -> None:
    store = harness.store
    large = bytes(i % 251 for i in range(1024 * 1024))  # 1 MiB, under etcd's 1.5 MiB limit
    revision = await store.put(harness.key("large"), large)
    kv = await store.get(harness.key("large"))
    assert kv is not None
    assert kv.value == large
    async with aclosing(store.watch(harness.prefix, start_revision=revision)) as watch:
        events = await next_events(watch, 1)
    assert events[0].kv.value == large
    with pytest.raises(StateError, match="too large") as raised:
        await store.put(harness.key("huge"), b"x" * (1800 * 1024))
    assert not isinstance(raised.value, StateUnavailable)
    assert await store.get(harness.key("huge")) is None

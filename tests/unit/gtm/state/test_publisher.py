"""LeasedPublisher on the in-memory store and a fake clock: the lease protocol every
tier's summary and every worker's registration follow."""

from __future__ import annotations

import pytest

from gtm.clock import FakeClock
from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.models import RegionSummary
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtm.state.publisher import LeasedPublisher
from gtm.testing.outage import OutageStore

KEY = keys.region_summary("r1")


def _summary(at: float) -> RegionSummary:
    return RegionSummary(region_id="r1", published_at=at)


async def _stored(store: MemoryStore) -> RegionSummary | None:
    kv = await store.get(KEY)
    return None if kv is None else codec.decode(kv.key, kv.value, RegionSummary)


async def test_the_record_lives_under_its_lease_kept_alive_each_round() -> None:
    clock = FakeClock()
    store = MemoryStore(clock, new_registry())
    publisher = LeasedPublisher(store, KEY, ttl_s=3.0, what="region summary")
    assert publisher.lease_id == 0
    await publisher.publish(_summary(1.0))
    kv = await store.get(KEY)
    assert kv is not None
    assert kv.lease == publisher.lease_id != 0
    first_lease = publisher.lease_id
    for second in range(2, 12):  # a round a second keeps a 3 s lease through 10 s
        await clock.advance(1.0)
        await publisher.publish(_summary(float(second)))
    assert publisher.lease_id == first_lease
    assert await _stored(store) == _summary(11.0)
    assert publisher.published == 11
    await clock.advance(5.0)  # the writer stops renewing: the record goes by itself
    assert await store.get(KEY) is None


async def test_a_lost_lease_is_granted_anew_and_the_record_written_again() -> None:
    clock = FakeClock()
    store = MemoryStore(clock, new_registry())
    publisher = LeasedPublisher(store, KEY, ttl_s=3.0, what="region summary")
    record = _summary(1.0)
    await publisher.publish(record, only_changes=True)
    lost = publisher.lease_id
    await store.revoke_lease(lost)  # e.g. it expired while the store was unreachable
    assert publisher.written == record  # the publisher does not know yet
    await publisher.publish(record, only_changes=True)  # unchanged, but the lease is new
    kv = await store.get(KEY)
    assert kv is not None
    assert kv.lease == publisher.lease_id not in (0, lost)
    assert publisher.published == 2


async def test_only_changes_skips_the_write_of_an_equal_record() -> None:
    clock = FakeClock()
    store = MemoryStore(clock, new_registry())
    publisher = LeasedPublisher(store, KEY, ttl_s=3.0, what="region summary")
    await publisher.publish(_summary(1.0), only_changes=True)
    revision = await store.current_revision()
    await clock.advance(1.0)
    await publisher.publish(_summary(1.0), only_changes=True)
    assert await store.current_revision() == revision  # kept alive, not written
    await publisher.publish(_summary(2.0), only_changes=True)
    assert await _stored(store) == _summary(2.0)
    assert publisher.published == 2


async def test_store_errors_propagate_and_the_written_record_stands() -> None:
    clock = FakeClock()
    store = OutageStore(MemoryStore(clock, new_registry()))
    publisher = LeasedPublisher(store, KEY, ttl_s=3.0, what="region summary")
    await publisher.publish(_summary(1.0))
    store.down = True
    with pytest.raises(StateUnavailable):
        await publisher.publish(_summary(2.0))
    assert publisher.written == _summary(1.0)  # still under the live lease
    store.down = False
    await publisher.publish(_summary(2.0), only_changes=True)
    assert await _stored(store.inner) == _summary(2.0)


async def test_withdraw_revokes_at_once_and_never_raises() -> None:
    clock = FakeClock()
    store = OutageStore(MemoryStore(clock, new_registry()))
    publisher = LeasedPublisher(store, KEY, ttl_s=3.0, what="region summary")
    await publisher.withdraw()  # nothing published yet: nothing to do
    await publisher.publish(_summary(1.0))
    await publisher.withdraw()
    assert await store.inner.get(KEY) is None
    assert publisher.lease_id == 0
    assert publisher.written is None
    await publisher.withdraw()  # idempotent

    await publisher.publish(_summary(2.0))
    store.down = True
    await publisher.withdraw()  # the store is unreachable: logged, the lease will expire
    assert publisher.lease_id == 0

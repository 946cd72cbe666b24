from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from gtm.clock import FakeClock
from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from regional_lb.leases import (
    CapacityLeases,
    LeaseSettings,
    QuotaLeaseRecord,
    demand_fraction,
    fair_shares,
    pool_totals,
)
from regional_lb.quota import Cost, Demand, Dimension, Grant, Pool, QuotaLimiter, Ticket
from tests.unit.regional_lb.helpers import FlakyStore, quotas

SETTINGS = LeaseSettings(ttl=5.0, refresh_interval=1.0, safe_share=0.3)
POOL = Pool("unlisted", 1.0)


class Replica:
    def __init__(
        self,
        name: str,
        store: FlakyStore[MemoryStore] | MemoryStore,
        clock: FakeClock,
        settings: LeaseSettings = SETTINGS,
        rpm: int = 6000,
        region: str = "r1",
        max_concurrent: int | None = None,
    ) -> None:
        self.name = name
        self.clock = clock
        self.limiter = QuotaLimiter()
        self.registry = new_registry()
        self.limiter.configure(
            "t1",
            quotas(requests_per_minute=rpm)
            if max_concurrent is None
            else quotas(requests_per_minute=rpm, max_concurrent=max_concurrent),
            1.0,
            Grant(0.0, math.inf, 0.0),
            clock.monotonic(),
        )
        self.leases = CapacityLeases(
            store,
            self.limiter,
            replica_id=name,
            region=region,
            clock=clock,
            registry=self.registry,
            settings=settings,
        )
        self.leases.configure({"t1": POOL})

    def load(self, requests: int) -> int:
        """Ask for ``requests`` requests now (admitted ones finish at once); how many
        were admitted."""
        admitted = 0
        for _ in range(requests):
            ticket = self.limiter.admit("t1", Cost(1, 1), self.clock.monotonic())
            if isinstance(ticket, Ticket):
                self.limiter.finish(ticket, self.clock.monotonic())
                admitted += 1
        return admitted

    @property
    def share(self) -> float:
        return self.leases.share("t1")


async def records(store: MemoryStore) -> list[QuotaLeaseRecord]:
    listing = await store.range(keys.prefix(keys.Kind.QUOTA_LEASE))
    return [codec.decode(kv.key, kv.value, QuotaLeaseRecord) for kv in listing.kvs]


async def rounds(clock: FakeClock, replicas: list[Replica], n: int, load: int = 0) -> None:
    for _ in range(n):
        for replica in replicas:
            replica.load(load)
        for replica in replicas:
            await replica.leases.refresh()
        await clock.advance(1.0)


# ---------------------------------------------------------------------------- pure parts


def test_fair_shares_meets_small_wants_and_splits_the_rest() -> None:
    assert fair_shares(1.0, {"a": 1.0, "b": 1.0}) == {"a": 0.5, "b": 0.5}
    shares = fair_shares(1.0, {"a": 0.1, "b": 1.0, "c": 1.0})
    assert shares == pytest.approx({"a": 0.1, "b": 0.45, "c": 0.45})
    spare = fair_shares(1.0, {"a": 0.2, "b": 0.4})
    assert spare == pytest.approx({"a": 0.4, "b": 0.6})
    assert fair_shares(1.0, {}) == {}
    assert sum(fair_shares(1.0, {str(i): i / 7 for i in range(9)}).values()) == pytest.approx(1)


def test_demand_fraction_takes_the_tightest_limit() -> None:
    demand = Demand({Dimension.REQUESTS: 30.0, Dimension.INPUT_TOKENS: 10.0}, 2)
    limits = {Dimension.REQUESTS: 60.0, Dimension.INPUT_TOKENS: 600.0}
    assert demand_fraction(demand, limits, 1.0) == 30.0
    assert demand_fraction(demand, {Dimension.CONCURRENCY: 4.0}, 1.0) == 0.5
    assert demand_fraction(demand, limits, 0.0) == 0.0


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="interval"):
        LeaseSettings(ttl=1.0, refresh_interval=2.0)
    with pytest.raises(ValueError, match="safe_share"):
        LeaseSettings(safe_share=1.5)
    with pytest.raises(ValueError, match="headroom"):
        LeaseSettings(headroom=0.5)


# ---------------------------------------------------------------------------- rounds


async def test_a_replica_alone_gets_the_whole_pool(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    replica = Replica("a", store, fake_clock)
    assert replica.share == SETTINGS.safe_share  # before the first round: safe, unverified
    await rounds(fake_clock, [replica], 1)
    assert replica.share == 1.0
    assert replica.leases.holdings()["t1"] == (1.0, True)
    (record,) = await records(store)
    assert (record.replica, record.grant, record.pool) == ("a", 1.0, "unlisted")
    assert (
        replica.registry.get_sample_value("gtm_regional_quota_lease_share", {"tenant": "t1"}) == 1.0
    )


async def test_two_busy_replicas_converge_to_halves_and_never_overclaim(
    fake_clock: FakeClock,
) -> None:
    store = MemoryStore(fake_clock)
    a, b = Replica("a", store, fake_clock), Replica("b", store, fake_clock)
    await rounds(fake_clock, [a], 2, load=500)
    for _ in range(5):
        await rounds(fake_clock, [a, b], 1, load=500)
        assert sum(pool_totals(await records(store)).values()) <= 1.0 + 1e-9
        backed = [r.leases.holdings()["t1"] for r in (a, b)]
        assert sum(share for share, ok in backed if ok) <= 1.0 + 1e-9
    assert a.share == pytest.approx(0.5)
    assert b.share == pytest.approx(0.5)


class StaleFirstRead:
    """A store whose first ``range`` answer is delivered only after ``release`` is set:
    the replica acts on a listing that another replica's whole round has since changed."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.release = asyncio.Event()
        self._first = True

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def range(self, prefix: str) -> object:
        listing = await self._store.range(prefix)
        if self._first:
            self._first = False
            await self.release.wait()
        return listing


async def test_a_claim_lost_at_startup_enforces_nothing_until_verified(
    fake_clock: FakeClock,
) -> None:
    # b reads the empty pool, then a claims and verifies the whole pool, then b claims it
    # too, sees the collision and gives its claim back. b must not go on using the
    # unrecorded safe share beside a's verified 1.0 (a CI run caught 0.3 + 1.0).
    store = MemoryStore(fake_clock)
    stale = StaleFirstRead(store)
    a = Replica("a", store, fake_clock)
    b = Replica("b", stale, fake_clock)  # type: ignore[arg-type]

    async def a_then_release() -> None:
        await a.leases.refresh()
        stale.release.set()

    await asyncio.gather(b.leases.refresh(), a_then_release())
    assert a.leases.holdings()["t1"] == (1.0, True)
    assert b.leases.holdings()["t1"] == (0.0, False)
    assert a.share + b.share <= 1.0 + 1e-9
    assert (
        b.registry.get_sample_value("gtm_regional_quota_lease_conflicts_total", {"tenant": "t1"})
        == 1.0
    )
    # With each other's wants on record the next rounds converge without colliding.
    await rounds(fake_clock, [a, b], 3, load=500)
    assert (a.share, b.share) == pytest.approx((0.5, 0.5))


async def test_shares_follow_demand(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    heavy, light = Replica("heavy", store, fake_clock), Replica("light", store, fake_clock)
    for _ in range(8):
        heavy.load(200)  # twice the pool rate of 100/s
        light.load(10)
        await rounds(fake_clock, [heavy, light], 1)
    assert light.share == pytest.approx(0.125, abs=0.03)  # 10 % demand + 25 % headroom
    assert heavy.share == pytest.approx(1 - light.share, abs=1e-6)


async def test_outage_falls_back_to_the_safe_share_and_reconverges(
    fake_clock: FakeClock,
) -> None:
    store = FlakyStore(MemoryStore(fake_clock))
    a, b = Replica("a", store, fake_clock), Replica("b", store, fake_clock)
    await rounds(fake_clock, [a, b], 4, load=500)
    assert (a.share, b.share) == pytest.approx((0.5, 0.5))
    store.down = True
    for replica in (a, b):
        with pytest.raises(StateUnavailable):
            await replica.leases.refresh()
    assert a.share == 0.5  # still within the lease
    await fake_clock.advance(SETTINGS.ttl)
    assert (a.share, b.share) == (SETTINGS.safe_share, SETTINGS.safe_share)
    assert a.registry.get_sample_value("gtm_regional_quota_safe_mode") == 1.0
    await fake_clock.advance(10.0)  # the store expires the old leases meanwhile
    store.down = False
    await rounds(fake_clock, [a, b], 4, load=500)
    assert (a.share, b.share) == pytest.approx((0.5, 0.5))
    assert a.leases.holdings()["t1"] == (0.5, True)
    assert a.registry.get_sample_value("gtm_regional_quota_safe_mode") == 0.0


async def test_a_replica_alone_in_its_pool_keeps_its_share_through_an_outage(
    fake_clock: FakeClock,
) -> None:
    """Static stability: with the store down for everyone, nobody can claim the pool, so
    the only replica of a pool keeps enforcing what it held (not the safe share)."""
    store = FlakyStore(MemoryStore(fake_clock))
    alone = Replica("a", store, fake_clock)
    await rounds(fake_clock, [alone], 3, load=500)
    assert alone.share == 1.0
    store.down = True
    with pytest.raises(StateUnavailable):
        await alone.leases.refresh()
    await fake_clock.advance(SETTINGS.ttl * 4)
    assert alone.share == 1.0
    assert alone.registry.get_sample_value("gtm_regional_quota_safe_mode") == 1.0
    store.down = False
    await rounds(fake_clock, [alone], 2, load=500)
    assert alone.leases.holdings()["t1"] == (1.0, True)


async def test_keep_share_when_alone_off_is_doorman_strict(fake_clock: FakeClock) -> None:
    store = FlakyStore(MemoryStore(fake_clock))
    strict = dataclasses.replace(SETTINGS, keep_share_when_alone=False)
    alone = Replica("a", store, fake_clock, settings=strict)
    await rounds(fake_clock, [alone], 3, load=500)
    store.down = True
    await fake_clock.advance(SETTINGS.ttl)
    assert alone.share == SETTINGS.safe_share


async def test_a_replica_that_was_not_alone_falls_back_to_the_safe_share(
    fake_clock: FakeClock,
) -> None:
    store = FlakyStore(MemoryStore(fake_clock))
    a, b = Replica("a", store, fake_clock), Replica("b", store, fake_clock)
    await rounds(fake_clock, [a, b], 4, load=500)
    await b.leases.close()  # b leaves; a has not seen that yet
    store.down = True
    await fake_clock.advance(SETTINGS.ttl)
    assert a.share == SETTINGS.safe_share


async def test_a_lost_lease_is_replaced(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    a = Replica("a", store, fake_clock)
    await rounds(fake_clock, [a], 1)
    (kv,) = (await store.range(keys.prefix(keys.Kind.QUOTA_LEASE))).kvs
    await store.revoke_lease(kv.lease)
    await rounds(fake_clock, [a], 1)
    assert a.share == 1.0
    (record,) = await records(store)
    assert record.grant == 1.0


async def test_close_hands_the_share_to_the_others(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    a, b = Replica("a", store, fake_clock), Replica("b", store, fake_clock)
    await rounds(fake_clock, [a, b], 3, load=500)
    await a.leases.close()
    await rounds(fake_clock, [b], 2, load=500)
    assert b.share == 1.0
    assert a.share == SETTINGS.safe_share  # a closed replica no longer holds a lease


async def test_other_pools_do_not_count(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    a = Replica("a", store, fake_clock)
    other = Replica("b", store, fake_clock)
    other.leases.configure({"t1": Pool("eu-west", 0.5)})
    await rounds(fake_clock, [a, other], 2, load=500)
    assert a.share == 1.0
    assert other.share == 1.0
    totals = pool_totals(await records(store))
    assert totals == {("t1", "unlisted"): 1.0, ("t1", "eu-west"): 1.0}


async def test_invalid_records_are_ignored(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    await store.put(keys.quota_lease("t1", "broken"), b"{not json")
    a = Replica("a", store, fake_clock)
    await rounds(fake_clock, [a], 1)
    assert a.share == 1.0


async def test_forgotten_tenants_are_dropped(fake_clock: FakeClock) -> None:
    store = MemoryStore(fake_clock)
    a = Replica("a", store, fake_clock)
    await rounds(fake_clock, [a], 1)
    a.leases.configure({})
    assert a.leases.holdings() == {}
    assert a.registry.get_sample_value("gtm_regional_quota_lease_share", {"tenant": "t1"}) is None


class InStep:
    """A store through which replicas take their first two reads and their first write
    in step: each waits at ``barrier`` until all have read the (empty) pool, until all
    have written their claim, and until all have re-read the pool to verify it — a
    collision where nobody's claim verifies."""

    def __init__(self, store: MemoryStore, barrier: asyncio.Barrier) -> None:
        self._store = store
        self._barrier = barrier
        self._reads = self._writes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def range(self, prefix: str) -> object:
        listing = await self._store.range(prefix)
        self._reads += 1
        if self._reads <= 2:
            await self._barrier.wait()
        return listing

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        revision = await self._store.put(key, value, lease=lease)
        self._writes += 1
        if self._writes == 1:
            await self._barrier.wait()
        return revision


async def test_two_replicas_starting_together_let_a_first_burst_through_the_collision(
    fake_clock: FakeClock,
) -> None:
    """Two regions on one pool start together: both claim the whole pool, both see the
    collision, both give their claims back and enforce a share of 0 until a round
    verifies one (Σ shares stays ≤ 1). A fresh tenant's first burst arriving in that
    round is still not refused, rate nor concurrency: a share of 0 lends its allowance.
    (Before, both refused everything: 'Too many concurrent requests', limit 0.)"""
    store = MemoryStore(fake_clock)
    barrier = asyncio.Barrier(2)
    a, b = (
        Replica(
            name,
            InStep(store, barrier),  # type: ignore[arg-type]
            fake_clock,
            LeaseSettings(),
            rpm=QUOTA,
            region=region,
            max_concurrent=64,
        )
        for name, region in (("a", "eu-west"), ("b", "eu-central"))
    )
    await asyncio.gather(a.leases.refresh(), b.leases.refresh())
    assert a.leases.holdings()["t1"] == b.leases.holdings()["t1"] == (0.0, False)
    for replica in (a, b):
        assert (
            replica.registry.get_sample_value(
                "gtm_regional_quota_lease_conflicts_total", {"tenant": "t1"}
            )
            == 1.0
        )
    assert sum(pool_totals(await records(store)).values()) <= 1.0 + 1e-9
    assert a.share + b.share <= 1.0 + 1e-9
    now = fake_clock.monotonic()
    burst = [a.limiter.admit("t1", Cost(1, 1), now) for _ in range(QUOTA)]
    assert all(isinstance(ticket, Ticket) for ticket in burst), burst  # running at once
    # The loan is the pool's minute, once: nothing more until a share is verified.
    assert not isinstance(a.limiter.admit("t1", Cost(1, 1), now), Ticket)
    for ticket in burst:
        assert isinstance(ticket, Ticket)
        a.limiter.finish(ticket, now)
    # With each other's wants on record the next rounds verify claims, never over 1.
    for _ in range(3):
        await rounds(fake_clock, [a, b], 1)
        assert sum(pool_totals(await records(store)).values()) <= 1.0 + 1e-9
        backed = [r.leases.holdings()["t1"] for r in (a, b)]
        assert sum(share for share, _ in backed) <= 1.0 + 1e-9
    assert all(ok for _, ok in (r.leases.holdings()["t1"] for r in (a, b)))


# ---------------------------------------------------------------------------- burst allowance

#: A tenant's quota in the burst tests: 60 requests/min over one pool of six regions.
QUOTA = 60


async def six_regions(clock: FakeClock) -> list[Replica]:
    """Six regional LBs drawing on one pool, settled on an even split (a fresh, idle
    tenant: a sixth each, as before any demand)."""
    store = MemoryStore(clock)
    replicas = [
        Replica(f"r{i}", store, clock, LeaseSettings(), rpm=QUOTA, region=f"region-{i}")
        for i in range(6)
    ]
    await rounds(clock, replicas, 3)
    assert [r.share for r in replicas] == pytest.approx([1 / 6] * 6, abs=1e-5)
    return replicas


async def overload(clock: FakeClock, replicas: list[Replica], seconds: int) -> list[int]:
    """Every replica asked for 10 requests a second (10x the whole quota), a lease round
    each second; what each admitted."""
    admitted = [0] * len(replicas)
    for _ in range(seconds):
        for _ in range(10):
            for i, replica in enumerate(replicas):
                admitted[i] += replica.load(1)
            await clock.advance(0.1)
        for replica in replicas:
            await replica.leases.refresh()
    return admitted


async def test_a_fresh_tenants_first_burst_passes_at_any_region(fake_clock: FakeClock) -> None:
    """Its share is a sixth of 60/min (a second of it is 1/6 of a request), yet a first
    burst of 60 gets no 429: the bucket lends up to the pool's minute while the other
    regions are idle. Then it refuses (one more fits: the second of its own share)."""
    replicas = await six_regions(fake_clock)
    assert replicas[3].load(QUOTA) == QUOTA
    assert replicas[3].load(10) <= 1


async def test_after_a_burst_no_region_exceeds_its_share_beyond_the_allowance(
    fake_clock: FakeClock,
) -> None:
    replicas = await six_regions(fake_clock)
    burst = replicas[0].load(QUOTA)
    assert burst == QUOTA
    await rounds(fake_clock, replicas, 1)  # the other regions see its demand
    # Then every region is overloaded for a minute.
    minute = await overload(fake_clock, replicas, 60)
    # The region that burst pays its debt back before it admits more (a sixth of the
    # pool repays a minute in six), so its minute is the burst and one second's rate.
    assert burst + minute[0] <= QUOTA + QUOTA / 6 / 60 + 1
    # The others saw its demand within a round: their allowance fell to their fair
    # share, so each admits at most its share of the minute plus that allowance.
    for admitted in minute[1:]:
        assert admitted <= QUOTA / 6 * 61 / 60 + QUOTA / 6 + 1
    # Over the burst's minute the pool as a whole exceeds its quota by at most the one
    # allowance the burst used.
    assert burst + sum(minute) <= QUOTA * 61 / 60 + QUOTA
    # Under sustained load no credit is earned back: the next minute holds the quota.
    assert sum(await overload(fake_clock, replicas, 60)) <= QUOTA * 61 / 60 + 1


async def test_a_busy_pool_lends_only_the_fair_share(fake_clock: FakeClock) -> None:
    """While the other regions show demand, a region may borrow only its fair share of
    the pool: sustained load everywhere plus a burst cannot take a whole minute."""
    replicas = await six_regions(fake_clock)
    await overload(fake_clock, replicas, 3)
    credit = replicas[2].limiter.credit("t1", fake_clock.monotonic())[Dimension.REQUESTS]
    assert credit <= QUOTA / 6 + 1e-9
    assert replicas[2].load(QUOTA) <= QUOTA / 6 + 1


async def test_replicas_of_one_region_split_its_allowance(fake_clock: FakeClock) -> None:
    """An HA pair shares its region's load, so both burst at once: each may lend half."""
    store = MemoryStore(fake_clock)
    pair = [Replica(n, store, fake_clock, LeaseSettings(), rpm=QUOTA) for n in ("a", "b")]
    await rounds(fake_clock, pair, 3)
    assert sum(replica.load(QUOTA) for replica in pair) <= QUOTA + 2


async def test_a_restarted_replica_starts_from_its_recorded_demand(fake_clock: FakeClock) -> None:
    """Demand history: a replica that restarts while its old record is still held (same
    replica id, old lease not yet expired) takes its share from the demand on record,
    not from an idle start that would hand most of the pool to the other replica."""
    store = MemoryStore(fake_clock)
    heavy, light = Replica("heavy", store, fake_clock), Replica("light", store, fake_clock)
    for _ in range(8):
        heavy.load(200)
        light.load(10)
        await rounds(fake_clock, [heavy, light], 1)
    before = heavy.share
    restarted = Replica("heavy", store, fake_clock)  # a new process, no demand seen yet
    await rounds(fake_clock, [restarted, light], 1)
    assert restarted.leases.holdings()["t1"][0] == pytest.approx(before, abs=0.1)

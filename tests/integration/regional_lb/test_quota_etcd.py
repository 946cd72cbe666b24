"""Distributed quotas through a real etcd: exactness under contention, store outages.

Time. The buckets and the lease validity run on an injected FakeClock; the store calls
are real etcd round trips. The tests drive one lease round per virtual second (awaited,
as the replica's refresh loop would run it) and offer load in virtual 100 ms steps, so
"60 seconds at 10× over-subscription" takes about a second of wall time. This is the
same protocol as 60 real seconds: admission depends only on the clock the limiter is
given and on the grants the rounds produce, and every round completes before the next
virtual second (the one thing real time could change is etcd's own lease TTL, which a
round never gets close to).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gtm.clock import FakeClock, SystemClock
from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.state.etcd_server import EtcdServer
from gtm.state.store import StateStore
from gtm.state.url import open_store
from regional_lb.leases import CapacityLeases, LeaseSettings
from regional_lb.quota import Cost, Grant, Pool, QuotaLimiter, QuotaSettings, Ticket
from tests.unit.regional_lb.helpers import quotas

pytestmark = [pytest.mark.etcd, pytest.mark.integration]

RPM = 600  # the tenant's quota: 10 requests a second
SETTINGS = LeaseSettings(ttl=5.0, refresh_interval=1.0, safe_share=0.3)

StoreFactory = Callable[[], Awaitable[StateStore]]


class Replica:
    def __init__(
        self,
        name: str,
        tenant: str,
        store: StateStore,
        clock: FakeClock,
        quota: QuotaSettings | None = None,
    ) -> None:
        self.clock = clock
        self.tenant = tenant
        self.limiter = QuotaLimiter(quota)
        self.limiter.configure(
            tenant, quotas(requests_per_minute=RPM), 1.0, Grant(0.0, math.inf, 0.0), 0.0
        )
        self.leases = CapacityLeases(
            store,
            self.limiter,
            replica_id=name,
            region="us-east",
            clock=clock,
            registry=new_registry(),
            settings=SETTINGS,
        )
        self.leases.configure({tenant: Pool("unlisted", 1.0)})
        self.admitted = 0

    def offer(self, requests: int) -> int:
        """Offer ``requests`` now; each admitted one finishes at once."""
        admitted = 0
        for _ in range(requests):
            ticket = self.limiter.admit(self.tenant, Cost(10, 10), self.clock.monotonic())
            if isinstance(ticket, Ticket):
                self.limiter.finish(ticket, self.clock.monotonic())
                admitted += 1
        self.admitted += admitted
        return admitted

    @property
    def share(self) -> float:
        return self.leases.share(self.tenant)


@pytest.fixture
async def stores(etcd_server: EtcdServer) -> AsyncIterator[StoreFactory]:
    opened: list[StateStore] = []

    async def make() -> StateStore:
        store = open_store(
            etcd_server.etcd_url, clock=SystemClock(), registry=new_registry(), timeout=2.0
        )
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.aclose()


async def rounds(replicas: list[Replica]) -> None:
    await asyncio.gather(*(r.leases.refresh() for r in replicas))


async def test_two_replicas_share_a_quota_within_5_percent(stores: StoreFactory) -> None:
    clock = FakeClock(start=0.0)
    tenant = f"exact-{uuid.uuid4().hex[:8]}"  # the session etcd is shared
    a = Replica("replica-a", tenant, await stores(), clock)
    b = Replica("replica-b", tenant, await stores(), clock)
    # 10x over-subscription: each replica is offered 50 requests/s (the quota is 10/s),
    # in steps of 100 ms, for 60 virtual seconds, with a lease round every second.
    for second in range(60):
        await rounds([a, b])
        for _ in range(10):
            a.offer(5)
            b.offer(5)
            clock.advance_nowait(0.1)
        assert a.share + b.share <= 1.0 + 1e-9, f"over-allocated at {second}s"
    total = a.admitted + b.admitted
    print(f"admitted {total} of a {RPM}-request minute ({total / RPM:.3f}x)")
    assert total <= RPM * 1.05
    assert total >= RPM * 0.9  # and the quota is actually used
    assert a.share == pytest.approx(0.5)
    assert b.share == pytest.approx(0.5)
    await a.leases.close()
    await b.leases.close()


async def test_etcd_down_falls_back_to_safe_shares_and_recovers(
    own_etcd_server: EtcdServer,
) -> None:
    clock = FakeClock(start=0.0)

    def store() -> StateStore:
        return open_store(
            own_etcd_server.etcd_url, clock=SystemClock(), registry=new_registry(), timeout=0.5
        )

    # Strict per-second quantisation: this is about the lease fallback; a loan's debt
    # (the burst allowance) would be paid back during the outage instead.
    strict = QuotaSettings(burst_allowance=0.0)
    a = Replica("replica-a", "tenant-x", store(), clock, strict)
    b = Replica("replica-b", "tenant-x", store(), clock, strict)
    for _ in range(3):
        a.offer(50)
        b.offer(50)
        await rounds([a, b])
        await clock.advance(1.0)
    assert (a.share, b.share) == pytest.approx((0.5, 0.5))

    own_etcd_server.stop()
    for replica in (a, b):
        with pytest.raises(StateUnavailable):
            await replica.leases.refresh()
    await clock.advance(SETTINGS.ttl)
    assert (a.share, b.share) == (SETTINGS.safe_share, SETTINGS.safe_share)
    # Traffic continues at the safe share: 0.3 x 10/s each, for 10 virtual seconds.
    served = 0
    for _ in range(100):
        served += a.offer(5) + b.offer(5)
        clock.advance_nowait(0.1)
    assert served == pytest.approx(2 * 0.3 * 10 * 10, abs=4)

    own_etcd_server.start()
    for _ in range(20):
        a.offer(50)
        b.offer(50)
        with contextlib.suppress(StateUnavailable):  # the client may still be reconnecting
            await rounds([a, b])
        await clock.advance(1.0)
        holdings = [r.leases.holdings()[r.tenant] for r in (a, b)]
        if all(backed for _, backed in holdings) and a.share == b.share == 0.5:
            break
    assert (a.share, b.share) == pytest.approx((0.5, 0.5))
    assert all(r.leases.holdings()[r.tenant][1] for r in (a, b))
    for replica in (a, b):
        await replica.leases.close()

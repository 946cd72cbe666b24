"""Property: concurrent capacity-lease rounds never hand out more than a pool.

Several replicas run their rounds concurrently against one store, with demands that
change between rounds, and every store call yields to the event loop a random number of
times first — so the replicas' reads and writes interleave in every way asyncio allows.
After every store call, the shares the replicas *enforce under a verified claim* must sum
to at most 1 (the write-then-verify protocol of ``regional_lb.leases``); and once demand
stops changing, a few rounds give each busy replica its max-min fair share.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncGenerator, Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.state.memory import MemoryStore
from gtm.state.store import KeyValue, Lease, RangeResult, TxnResult, WatchBatch
from regional_lb.leases import CapacityLeases, LeaseSettings
from regional_lb.quota import Cost, Grant, Pool, QuotaLimiter, Ticket
from tests.unit.regional_lb.helpers import quotas

SETTINGS = LeaseSettings(ttl=30.0, refresh_interval=1.0, safe_share=0.2)


class ShuffledStore:
    """A MemoryStore whose calls first yield a random number of times; checks an
    invariant after each call."""

    def __init__(self, inner: MemoryStore, rng: random.Random, check: Callable[[], None]) -> None:
        self.inner = inner
        self.rng = rng
        self.check = check

    async def _jitter(self) -> None:
        for _ in range(self.rng.randrange(4)):
            await asyncio.sleep(0)

    async def get(self, key: str) -> KeyValue | None:
        await self._jitter()
        return await self.inner.get(key)

    async def range(self, prefix: str) -> RangeResult:
        await self._jitter()
        result = await self.inner.range(prefix)
        self.check()
        return result

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        await self._jitter()
        revision = await self.inner.put(key, value, lease=lease)
        self.check()
        return revision

    async def delete(self, key: str) -> bool:
        return await self.inner.delete(key)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        return await self.inner.compare_and_swap(
            key, value, expected_mod_revision=expected_mod_revision, lease=lease
        )

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> TxnResult:
        return await self.inner.compare_and_delete(key, expected_mod_revision=expected_mod_revision)

    async def grant_lease(self, ttl: float) -> Lease:
        await self._jitter()
        return await self.inner.grant_lease(ttl)

    async def keep_alive(self, lease_id: int) -> float:
        await self._jitter()
        return await self.inner.keep_alive(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self.inner.revoke_lease(lease_id)

    async def current_revision(self) -> int:
        return await self.inner.current_revision()

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    def watch(self, prefix: str, *, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        return self.inner.watch(prefix, start_revision=start_revision)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _verified_total(replicas: list[tuple[QuotaLimiter, CapacityLeases]]) -> float:
    return math.fsum(
        share for _, leases in replicas for share, backed in leases.holdings().values() if backed
    )


async def _scenario(
    seed: int, demands: list[list[int]]
) -> list[tuple[QuotaLimiter, CapacityLeases]]:
    clock = FakeClock(start=0.0)
    rng = random.Random(seed)
    replicas: list[tuple[QuotaLimiter, CapacityLeases]] = []
    worst = [0.0]

    def check() -> None:
        total = _verified_total(replicas)
        worst[0] = max(worst[0], total)
        assert total <= 1.0 + 1e-9, f"verified shares sum to {total}"

    store = ShuffledStore(MemoryStore(clock), rng, check)
    for i in range(len(demands[0])):
        limiter = QuotaLimiter()
        limiter.configure("t", quotas(requests_per_minute=600), 1.0, Grant(0.0, math.inf, 0.0), 0.0)
        leases = CapacityLeases(
            store,
            limiter,
            replica_id=f"r{i}",
            region="r",
            clock=clock,
            registry=new_registry(),
            settings=SETTINGS,
        )
        leases.configure({"t": Pool("unlisted", 1.0)})
        replicas.append((limiter, leases))
    for step in demands:
        for (limiter, _), requests in zip(replicas, step, strict=True):
            for _ in range(requests):
                ticket = limiter.admit("t", Cost(1, 1), clock.monotonic())
                if isinstance(ticket, Ticket):
                    limiter.finish(ticket, clock.monotonic())
        await asyncio.gather(*(leases.refresh() for _, leases in replicas))
        check()
        await clock.advance(1.0)
    return replicas


@settings(
    max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(2, 4).flatmap(
        lambda n: st.lists(
            st.lists(st.integers(0, 40), min_size=n, max_size=n), min_size=1, max_size=6
        )
    ),
)
def test_concurrent_rounds_never_overallocate_a_pool(seed: int, demands: list[list[int]]) -> None:
    asyncio.run(_scenario(seed, demands))


@settings(
    max_examples=20, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.integers(0, 2**32 - 1), st.integers(2, 4))
def test_steady_saturating_demand_converges_to_equal_shares(seed: int, n: int) -> None:
    replicas = asyncio.run(_scenario(seed, [[40] * n] * 8))
    shares = [leases.holdings()["t"] for _, leases in replicas]
    assert all(backed for _, backed in shares)
    for share, _ in shares:
        assert abs(share - 1 / n) < 1e-6

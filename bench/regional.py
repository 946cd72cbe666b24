"""The regional LB's figures: admission latency, quota exactness, fairness, spill reaction.

1. **Admission decision latency** (µs): the sans-io path every request takes — the
   residency verdict (memoised, as in production), the tenant's token buckets, and the
   zone choice over 3 zones and 5 peers (routing profile + capacity-aware split) —
   measured one request at a time after ``gc.freeze()`` (as ``gtm regional`` does).
   Target: admission p99 < 200 µs.
2. **Quota over-admission under contention**: N replicas share one tenant pool through
   capacity leases in the state store (in-process store; every store call yields to the
   event loop a random number of times so the replicas' lease rounds interleave), each
   offered 10× its fair rate for 60 virtual seconds. Printed: admitted / quota. Also with
   one replica cut off from the store (it enforces its safe share).
3. **Fairness** (VTC vs FIFO): a saturated region (16 req/s), a heavy tenant sending 20×
   a light one's load; p99 queue waits and Jain's index of service relative to max-min
   fair shares.
4. **Spill after a zone loss**: one of two zones dies (its agent stops refreshing its
   summary lease, TTL 3 s as zone agents publish it); the regional view follows the
   store's watch. The demand fits the surviving zone: the capacity-aware split (the
   default) spills none of it; Envoy's split (``SplitMode.ENVOY``) spills 30 % once the
   lease has expired. Printed: the shares, the virtual time from the loss to Envoy's
   first spill, and the real CPU time from the watch event to that decision.

    python bench/regional.py           # full run (~6 s)
    python bench/regional.py --smoke   # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import math
import random
import time
from collections.abc import AsyncGenerator
from types import MappingProxyType

from gtm.clock import FakeClock
from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.models import ModelLoad, Priority, RegionSummary, RouteRequest, ZoneSummary
from gtm.policy_store import activate
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.store import KeyValue, Lease, RangeResult, TxnResult, WatchBatch
from gtm.stats import percentile
from gtm.tasks import TaskSupervisor
from policies import ResidencyQuery, load_examples
from policies.documents import Quotas, SaturationPolicy
from regional_lb.fairqueue import FairQueue, jain_index
from regional_lb.leases import CapacityLeases, LeaseSettings
from regional_lb.priority import SplitMode
from regional_lb.profiles import build, profile_spec
from regional_lb.quota import Cost, Grant, Pool, QuotaLimiter, Ticket
from regional_lb.router import Inputs, RegionalRouter, Route, RouterSettings
from regional_lb.spill import SpillLimiter, SpillSettings
from regional_lb.view import PeerInfo, RegionalView, ViewBuilder, ViewSettings, ZoneInfo

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ADMISSION_TARGET_S = 200e-6


# ---------------------------------------------------------------------------- 1. latency


def _load(queued: int = 2_000, gpus: int = 8) -> ModelLoad:
    return ModelLoad(
        model=MODEL,
        gpus=gpus,
        healthy_gpus=gpus,
        prefill_tokens_per_s=15_000.0 * gpus,
        queued_prefill_tokens=queued,
        running_requests=40,
        max_running_requests=64 * gpus,
    )


def _bench_view() -> RegionalView:
    zones = {
        f"us-east-{z}": ZoneInfo(
            f"us-east-{z}",
            ZoneSummary(
                zone_id=f"us-east-{z}",
                region_id="us-east",
                published_at=0.0,
                models=(_load(queued=1_000 * (i + 1)),),
                prefix_sketch=tuple(range(i, i + 32)),
            ),
            False,
            f"http://zone-{z}",
            2.0,
            frozenset(range(i, i + 32)),
        )
        for i, z in enumerate("abc")
    }
    peers = {
        region: PeerInfo(
            region,
            RegionSummary(region_id=region, published_at=0.0, models=(_load(),)),
            False,
            f"http://{region}",
            rtt,
        )
        for region, rtt in (
            ("us-west", 68.0),
            ("eu-west", 70.0),
            ("eu-central", 93.0),
            ("ap-northeast", 163.0),
            ("ap-southeast", 222.0),
        )
    }
    return RegionalView(
        region="us-east",
        snapshot_revision=1,
        policy=None,
        zones=MappingProxyType(zones),
        peers=MappingProxyType(peers),
        settings=ViewSettings(),
    )


def admission_latency(iterations: int) -> tuple[dict[str, tuple[float, float]], bool]:
    policy = activate(1, load_examples())
    engine = policy.engine
    limiter = QuotaLimiter()
    tenants = [f"tenant-{i:03d}" for i in range(100)]
    quotas = Quotas(
        requests_per_minute=10**9, weighted_tokens_per_minute=10**12, max_concurrent=10**6
    )
    for tenant in tenants:
        limiter.configure(tenant, quotas, 1.0, Grant(1.0, math.inf, 1.0), 0.0)
    view = _bench_view()
    router = RegionalRouter(
        build(profile_spec(policy)),
        saturation_filter="saturation",
        limiter=SpillLimiter(SpillSettings(per_peer_rate=1e9, per_peer_burst=1e9)),
    )
    queue: FairQueue[int] = FairQueue()
    countries = ["US", "DE", "JP", "SG", "BR", "IE"]
    rng = random.Random(1)
    samples: dict[str, list[float]] = {
        "admission": [],
        "+ queue": [],
        "zone choice": [],
        "total": [],
    }
    gc.collect()
    gc.freeze()
    clock = time.perf_counter
    for i in range(iterations):
        tenant = tenants[i % len(tenants)]
        query = ResidencyQuery("demo-global", MODEL, "default", countries[i % len(countries)])
        request = RouteRequest(
            request_id=f"r{i}",
            model=MODEL,
            input_tokens=rng.randrange(100, 4_000),
            max_output_tokens=256,
            tenant="demo-global",
            prefix_hashes=tuple(range(i % 8, i % 8 + 4)),
        )
        now = i * 1e-3
        t0 = clock()
        verdict = engine.allowed_regions(query)
        ticket = limiter.admit(tenant, Cost(request.input_tokens, 256), now)
        t1 = clock()
        item = queue.offer(
            tenant, Priority.INTERACTIVE, i, input_tokens=100, output_tokens=256, now=now
        )
        queue.pop()
        t2 = clock()
        decision = router.decide(
            request,
            view,
            Inputs(verdict.allowed, verdict.on_saturation, client_country_known=True),
            accounting=None,
            now=now,
            now_wall=0.0,
        )
        t3 = clock()
        if isinstance(ticket, Ticket):
            limiter.finish(ticket, now)
        assert decision.route in (Route.LOCAL, Route.SPILL, Route.REFUSE), item
        samples["admission"].append(t1 - t0)
        samples["+ queue"].append(t2 - t0)
        samples["zone choice"].append(t3 - t2)
        samples["total"].append(t3 - t0)
    gc.unfreeze()
    figures = {k: (percentile(v, 0.5), percentile(v, 0.99)) for k, v in samples.items()}
    return figures, figures["admission"][1] < ADMISSION_TARGET_S


# ---------------------------------------------------------------------------- 2. quotas


class _Shuffled:
    """An in-process store whose calls yield a random number of times (interleavings),
    and which can be cut off for one replica."""

    def __init__(self, inner: MemoryStore, rng: random.Random) -> None:
        self.inner = inner
        self.rng = rng
        self.down = False

    async def _enter(self) -> None:
        for _ in range(self.rng.randrange(4)):
            await asyncio.sleep(0)
        if self.down:
            raise StateUnavailable("cut off")

    async def get(self, key: str) -> KeyValue | None:
        await self._enter()
        return await self.inner.get(key)

    async def range(self, prefix: str) -> RangeResult:
        await self._enter()
        return await self.inner.range(prefix)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        await self._enter()
        return await self.inner.put(key, value, lease=lease)

    async def delete(self, key: str) -> bool:
        await self._enter()
        return await self.inner.delete(key)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        await self._enter()
        return await self.inner.compare_and_swap(
            key, value, expected_mod_revision=expected_mod_revision, lease=lease
        )

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> TxnResult:
        await self._enter()
        return await self.inner.compare_and_delete(key, expected_mod_revision=expected_mod_revision)

    async def grant_lease(self, ttl: float) -> Lease:
        await self._enter()
        return await self.inner.grant_lease(ttl)

    async def keep_alive(self, lease_id: int) -> float:
        await self._enter()
        return await self.inner.keep_alive(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._enter()
        await self.inner.revoke_lease(lease_id)

    async def current_revision(self) -> int:
        await self._enter()
        return await self.inner.current_revision()

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    def watch(self, prefix: str, *, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        return self.inner.watch(prefix, start_revision=start_revision)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def over_admission(replicas: int, seconds: int, *, cut_off: bool, safe_share: float) -> float:
    """Admitted / quota for ``replicas`` sharing a 600 RPM pool at 10× load."""
    clock = FakeClock(start=0.0)
    rng = random.Random(replicas * 7 + cut_off)
    inner = MemoryStore(clock)
    stores = [_Shuffled(inner, rng) for _ in range(replicas)]
    settings = LeaseSettings(ttl=5.0, refresh_interval=1.0, safe_share=safe_share)
    rpm = 600
    limiters: list[QuotaLimiter] = []
    leases: list[CapacityLeases] = []
    for i, store in enumerate(stores):
        limiter = QuotaLimiter()
        limiter.configure("t", Quotas(requests_per_minute=rpm), 1.0, Grant(0.0, math.inf, 0.0), 0.0)
        lease = CapacityLeases(
            store,
            limiter,
            replica_id=f"r{i}",
            region="us-east",
            clock=clock,
            registry=new_registry(),
            settings=settings,
        )
        lease.configure({"t": Pool("unlisted", 1.0)})
        limiters.append(limiter)
        leases.append(lease)
    per_step = max(1, round(10 * rpm / 60 / replicas / 10))  # 10x the pool, in 100 ms steps
    admitted = 0
    for second in range(seconds):
        if cut_off and second == seconds // 4:
            stores[0].down = True
        results = await asyncio.gather(
            *(lease.refresh() for lease in leases), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, StateUnavailable):
                raise result
        for _ in range(10):
            for limiter in limiters:
                for _ in range(per_step):
                    ticket = limiter.admit("t", Cost(10, 10), clock.monotonic())
                    if isinstance(ticket, Ticket):
                        limiter.finish(ticket, clock.monotonic())
                        admitted += 1
            await clock.advance(0.1)
    return admitted / (rpm * seconds / 60)


# ---------------------------------------------------------------------------- 3. fairness


def fairness(horizon: float, *, fair: bool) -> tuple[float, float, float]:
    """(light p99 wait s, heavy p99 wait s, Jain's index) in a saturated region."""
    rng = random.Random(7)
    slots, service = 8, 0.5
    rates = {"heavy": 40.0, "light": 2.0}
    queue: FairQueue[tuple[str, float]] = FairQueue()
    events: list[tuple[float, int, str, str]] = []
    for tenant, rate in rates.items():
        t = rng.expovariate(rate)
        while t < horizon:
            events.append((t, len(events), "arrive", tenant))
            t += rng.expovariate(rate)
    heapq.heapify(events)
    seq = len(events)
    waits: dict[str, list[float]] = {"heavy": [], "light": []}
    busy = 0
    while events:
        now, _, kind, tenant = heapq.heappop(events)
        queue.expire(now)
        if kind == "arrive":
            key = tenant if fair else "everyone"
            queue.offer(
                key,
                Priority.INTERACTIVE,
                (tenant, now),
                input_tokens=100,
                output_tokens=50,
                now=now,
            )
        else:
            busy -= 1
        while busy < slots and (item := queue.pop()) is not None:
            who, arrived = item.payload
            waits[who].append(now - arrived)
            busy += 1
            heapq.heappush(events, (now + rng.expovariate(1 / service), seq, "done", who))
            seq += 1
    capacity = slots / service
    shares = {"light": rates["light"], "heavy": capacity - rates["light"]}
    served = {t: len(w) / horizon / shares[t] for t, w in waits.items()}
    return percentile(waits["light"], 0.99), percentile(waits["heavy"], 0.99), jain_index(served)


# ---------------------------------------------------------------------------- 4. spill


async def spill_reaction(mode: SplitMode) -> tuple[float, float, float]:
    """(virtual s from zone loss to first spill, share spilled from then on, real µs
    from the watch event to the first decision on the new view).

    Demand: 500 requests/s of 50 prompt tokens (25k tokens/s), well inside the surviving
    zone's 48k tokens/s of headroom (4 GPUs x 15k x 80 %): the capacity split keeps it
    all home, Envoy's health count spills 30 %. The share is counted from the loss (the
    capacity split never spills here, so there is no first spill to count from)."""
    clock = FakeClock(start=0.0)
    store = MemoryStore(clock)
    registry = new_registry()
    watcher = SnapshotWatcher(store, clock=clock, registry=registry, probe_interval=1.0)
    # Zone agent URLs as `--zone-url` gives them (no Zone records in this in-process run);
    # a zone without an endpoint is unhealthy.
    zone_urls = {z: f"http://{z}.zone.test" for z in ("us-east-a", "us-east-b")}
    builder = ViewBuilder("us-east", settings=ViewSettings(zone_urls=zone_urls))
    router = RegionalRouter(
        build(profile_spec(None)),
        saturation_filter="saturation",
        settings=RouterSettings(split_mode=mode),
        limiter=SpillLimiter(SpillSettings(per_peer_rate=1e9, per_peer_burst=1e9)),
    )
    inputs = Inputs(
        frozenset({"us-east", "us-west"}),
        SaturationPolicy.SPILL_WITHIN_ALLOWED,
        client_country_known=True,
    )
    leases: dict[str, int] = {}
    for zone in ("us-east-a", "us-east-b"):
        lease = await store.grant_lease(3.0)  # zone agents: three 1 s publish intervals
        leases[zone] = lease.id
        summary = ZoneSummary(
            zone_id=zone, region_id="us-east", published_at=clock.wall(), models=(_load(gpus=4),)
        )
        await store.put(keys.zone_summary("us-east", zone), codec.encode(summary), lease=lease.id)
    peer = RegionSummary(region_id="us-west", published_at=clock.wall(), models=(_load(gpus=32),))
    async with TaskSupervisor(registry=registry, clock=clock) as tasks:
        tasks.spawn("watch", watcher.run())
        await watcher.wait_ready()
        loss_at = 2.0
        first_spill: float | None = None
        spilled = after = 0
        seen = -1
        view = builder.build(watcher.current, None, now_wall=clock.wall())
        compute: float | None = None
        step = 0.01
        for i in range(int(10.0 / step)):
            now = clock.monotonic()
            # Live zone agents republish their summary every second (zone_agent/summary.py);
            # a summary that only keeps its lease alive ages into "stale" and would
            # make the region spill everything whatever the loss.
            alive = ("us-east-a", "us-east-b") if now < loss_at else ("us-east-a",)
            if i % int(1.0 / step) == 0:
                for zone in alive:
                    fresh = ZoneSummary(
                        zone_id=zone,
                        region_id="us-east",
                        published_at=clock.wall(),
                        models=(_load(gpus=4),),
                    )
                    key = keys.zone_summary("us-east", zone)
                    await store.put(key, codec.encode(fresh), lease=leases[zone])
            for zone in alive:
                await store.keep_alive(leases[zone])
            peer = peer.model_copy(update={"published_at": clock.wall()})
            await store.put(keys.region_summary("us-west"), codec.encode(peer))
            await store.expire_due()
            await clock.settle()
            changed = watcher.current.revision != seen
            t0 = time.perf_counter()
            if changed:
                seen = watcher.current.revision
                view = builder.build(watcher.current, None, now_wall=clock.wall())
                view = _with_peer_url(view)
            for k in range(5):
                request = RouteRequest(
                    request_id=f"q{i}-{k}", model=MODEL, input_tokens=50, tenant="t"
                )
                decision = router.decide(
                    request, view, inputs, accounting=None, now=now, now_wall=clock.wall()
                )
                if now >= loss_at and decision.route is Route.SPILL and first_spill is None:
                    first_spill = now - loss_at
                    compute = time.perf_counter() - t0
                if now >= loss_at:  # the share from the loss on
                    after += 1
                    spilled += decision.route is Route.SPILL
            await clock.advance(step)
    return (
        math.inf if first_spill is None else first_spill,
        spilled / max(1, after),
        math.nan if compute is None else compute * 1e6,
    )


def _with_peer_url(view: RegionalView) -> RegionalView:
    """The peer's LB URL (its summary carries none in this in-process run)."""
    peers = {
        pid: PeerInfo(p.id, p.summary, p.drained, p.url or f"http://{pid}", p.rtt_ms)
        for pid, p in view.peers.items()
    }
    return RegionalView(
        view.region,
        view.snapshot_revision,
        view.policy,
        view.zones,
        MappingProxyType(peers),
        view.region_drained,
        view.stale,
        view.settings,
    )


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run for CI")
    args = parser.parse_args()
    smoke = args.smoke
    print(f"regional LB benchmark ({'smoke' if smoke else 'full'} run)")

    figures, ok = admission_latency(3_000 if smoke else 30_000)
    print("\n1. decision latency per request, µs (p50 / p99; after gc.freeze())")
    for name, (p50, p99) in figures.items():
        print(f"   {name:<12} {p50 * 1e6:8.1f} / {p99 * 1e6:8.1f}")
    verdict = "OK" if ok else "MISSED"
    print(f"   admission p99 < {ADMISSION_TARGET_S * 1e6:.0f} µs: {verdict}")

    seconds = 20 if smoke else 60
    print(f"\n2. quota over-admission: admitted / quota, 10x load for {seconds} virtual s")
    for replicas in (2, 4):
        ratio = asyncio.run(over_admission(replicas, seconds, cut_off=False, safe_share=0.5))
        print(f"   {replicas} replicas, all connected:              {ratio:.3f}")
    for replicas, safe in ((2, 0.5), (4, 0.5), (4, 0.25)):
        ratio = asyncio.run(over_admission(replicas, seconds, cut_off=True, safe_share=safe))
        print(f"   {replicas} replicas, one cut off, safe share {safe:.2f}: {ratio:.3f}")

    horizon = 60.0 if smoke else 300.0
    print(f"\n3. fairness: heavy tenant 20x the light one, saturated region, {horizon:.0f} s")
    for label, fair in (("VTC", True), ("FIFO", False)):
        light, heavy, index = fairness(horizon, fair=fair)
        print(
            f"   {label:<5} light p99 wait {light * 1000:7.0f} ms, heavy p99 wait "
            f"{heavy * 1000:7.0f} ms, Jain's index {index:.4f}"
        )

    print("\n4. spill reaction after losing one of two zones (summary lease TTL 3 s)")
    _, share, _ = asyncio.run(spill_reaction(SplitMode.CAPACITY))
    print(f"   capacity split (default): {share:.1%} spilled in the 8 s after the loss")
    print("   (the surviving zone has headroom for the demand: 0 % expected)")
    delay, share, compute = asyncio.run(spill_reaction(SplitMode.ENVOY))
    print(f"   Envoy split: first spill {delay:.2f} virtual s after the loss; {share:.0%} spilled")
    print("   in the 8 s after it (the first 3 s: lease TTL; then 1.4 x 50 % health: 30 %)")
    print(f"   watch event -> rebuilt view -> first spill decision: {compute:.0f} µs of CPU")


if __name__ == "__main__":
    main()

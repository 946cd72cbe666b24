"""The discrete-event fleet simulator: regions → zones → analytic GPUs, with the tiers'
own decision code in the loop.

Events: request arrivals (a pointer into the pre-built workload, identical for every
policy), GPU events (:class:`~fleetsim.sim.gpu.FastGpu` announces its next first token
or completion; a version number drops stale ones), and the summary tick (every
``tick_s``: zone summaries → regional views and region summaries → the global view,
as the live publishers do once a second).

gtm's path per request: residency verdict (:mod:`policies`) → :class:`GlobalRouter`
``.decide`` → :class:`RegionalRouter` ``.decide`` (LOCAL / SPILL to a peer, decided again
there / QUEUE in the region's FIFO, re-placed with ``.place`` when work finishes, TTL
10 s / REFUSE) → the zone agent's :class:`ZoneProfile` ``.decide`` over a
:class:`ZoneView` whose :class:`Accounting` the simulator charges and releases exactly
as the agent does (``start`` at dispatch, ``prefill_done`` at the first token, ``close``
at the end). Network: client↔region RTT from the fitted distance model
(:func:`gtm.routing.cost.rtt_ms_from_distance`), region↔region from the measured Azure
table (:class:`regional_lb.rtt.RegionRtt`), added to TTFT and E2E.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from fleetsim.sim.fleet import FleetSpec, ZoneSpec
from fleetsim.sim.gpu import FastGpu, GpuEvents, Job
from fleetsim.sim.policies import PolicySpec, RegionMode
from fleetsim.sim.workload import SimRequest
from global_lb.health import HealthTable
from global_lb.keeper import build_view
from global_lb.plugins import global_registry
from global_lb.profiles import DEFAULT_REQUEST_PROFILE, build, profile_spec
from global_lb.router import GlobalRouter
from gtm.errors import NoEligibleCandidate, RoutingError
from gtm.gpu_profiles import get_profile
from gtm.models import (
    ClientInfo,
    Endpoint,
    GpuWorker,
    Priority,
    Region,
    RegionSummary,
    RouteRequest,
)
from gtm.policy_store import ActivePolicy
from gtm.routing.cost import rtt_ms_from_distance
from gtm.state.snapshot import FleetSnapshot
from policies import ResidencyQuery, Verdict
from regional_lb import profiles as regional_profiles
from regional_lb.router import Inputs, RegionalRouter, Route
from regional_lb.rtt import RegionRtt
from regional_lb.summary import build_summary as region_summary
from regional_lb.view import ViewBuilder as RegionalViewBuilder
from regional_lb.view import ViewSettings as RegionalViewSettings
from regional_lb.view import ZoneAccounting
from zone_agent.accounting import Accounting, Ticket
from zone_agent.pipeline import ModelNotServed
from zone_agent.pipeline import ZoneProfile as GpuProfileRunner
from zone_agent.profiles import builtin_profile
from zone_agent.request import Endpoint as ZoneEndpoint
from zone_agent.request import ZoneRequest
from zone_agent.summary import build_summary as zone_summary
from zone_agent.view import GpuState, ViewBuilder, ZoneView

#: Interactive band TTL of the regional fair queue (regional_lb README): 10 s.
QUEUE_TTL_S = 10.0
#: GORGO's default prefill cost per token (atoniolo76/gotoni, pkg/config/constants.go).
GORGO_TP_MS = 0.094
#: SkyWalker-like push: home region's queued requests per GPU above which it pushes,
#: and the most a peer may have to receive (assumption; SkyWalker pushes on pending).
SKYWALKER_PUSH_AT = 2.0
SKYWALKER_PEER_MAX = 1.0


class Status:
    OK = 0
    REFUSED = 1
    TIMED_OUT = 2
    PENDING = 3


@dataclass(slots=True)
class Outcomes:
    """Per-request results, as arrays indexed like the workload."""

    n: int
    status: np.ndarray = field(init=False)
    ttft_s: np.ndarray = field(init=False)
    e2e_s: np.ndarray = field(init=False)
    region: np.ndarray = field(init=False)
    home: np.ndarray = field(init=False)
    cached: np.ndarray = field(init=False)
    violation: np.ndarray = field(init=False)
    ends: np.ndarray = field(init=False)
    reason: list[str] = field(init=False)

    def __post_init__(self) -> None:
        n = self.n
        self.status = np.full(n, Status.PENDING, dtype=np.int8)
        self.ttft_s = np.full(n, np.nan)
        self.e2e_s = np.full(n, np.nan)
        self.region = np.full(n, -1, dtype=np.int16)
        self.home = np.full(n, -1, dtype=np.int16)
        self.cached = np.zeros(n)
        self.violation = np.zeros(n, dtype=np.bool_)
        self.ends = np.zeros(n, dtype=np.int16)
        self.reason = [""] * n


@dataclass(slots=True)
class RunResult:
    policy: str
    outcomes: Outcomes
    wall_s: float
    sim_s: float
    gpu_busy_s: np.ndarray
    gpu_region: np.ndarray
    gpu_types: tuple[str, ...]
    max_kv_fraction: float
    spills: int
    util_timeline: list[tuple[float, tuple[float, ...]]]
    prefix_hit_tokens: int
    prefix_queried_tokens: int


class _Pool:
    """A set of GPUs behind one zone agent decision (a zone, or a region's whole pool)."""

    def __init__(self, zone_id: str, region: str, gpus: Sequence[tuple[str, str]], model: str):
        self.zone_id = zone_id
        self.region = region
        self.acc = Accounting(capacity=len(gpus))
        states = []
        self.gpus: dict[str, FastGpu] = {}
        for gpu_id, gpu_type in gpus:
            worker = GpuWorker(
                id=gpu_id,
                zone_id=zone_id,
                region_id=region,
                url=f"http://{gpu_id}.sim",
                gpu_type=gpu_type,
                models=(model,),
            )
            states.append(GpuState(worker=worker, slot=self.acc.slot(gpu_id)))
            self.gpus[gpu_id] = FastGpu(gpu_id, get_profile(gpu_type, model))
        self.view: ZoneView = ViewBuilder(zone_id, region).build(states, self.acc, 0.0)
        self.profile: GpuProfileRunner | None = None
        self.running_tokens = 0.0

    def matched_blocks(self, hashes: tuple[int, ...]) -> int:
        hits = self.acc.prefix.match(hashes)
        return max(hits.values(), default=0)


@dataclass(slots=True)
class _Live:
    """One request in flight."""

    index: int
    job: Job
    pool: _Pool
    ticket: Ticket
    extra_ms: float
    region: int


class Simulator:
    """One policy over one fleet and workload. ``run()`` once."""

    def __init__(
        self,
        fleet: FleetSpec,
        policy: ActivePolicy,
        spec: PolicySpec,
        requests: Sequence[SimRequest],
        *,
        model: str,
        tick_s: float = 1.0,
        duration_s: float | None = None,
        progress: Callable[[float], None] | None = None,
        seed: int = 0,
    ) -> None:
        self.fleet = fleet
        self.policy = policy
        self.spec = spec
        self.requests = requests
        self.model = model
        self.tick_s = tick_s
        self.seed = seed
        self.progress = progress
        self.duration_s = (
            duration_s if duration_s is not None else (requests[-1].at_s if requests else 0.0)
        )
        self.region_ids = tuple(r.id for r in fleet.regions)
        self.region_index = {r: i for i, r in enumerate(self.region_ids)}
        self.rtt = RegionRtt()
        self.regions: dict[str, Region] = {
            r.id: r.record.model_copy(
                update={"endpoints": (Endpoint(url=f"http://{r.id}.sim:8080"),)}
            )
            for r in fleet.regions
        }
        self.hier = spec.region_mode is RegionMode.GTM
        self.pools: dict[str, _Pool] = {}
        self.region_pools: dict[str, list[_Pool]] = {r: [] for r in self.region_ids}
        for region in fleet.regions:
            zones: Sequence[ZoneSpec] = region.zones
            if self.hier:
                for zone in zones:
                    self._add_pool(zone.id, region.id, zone.gpus)
            else:
                flat = [g for zone in zones for g in zone.gpus]
                self._add_pool(f"{region.id}-pool", region.id, flat)
        self.gpu_list = [g for p in self.pools.values() for g in p.gpus.values()]
        self.gpu_pos = {id(g): i for i, g in enumerate(self.gpu_list)}
        self.gpu_region = np.array(
            [self.region_index[p.region] for p in self.pools.values() for _ in p.gpus]
        )
        self.region_gpus = np.bincount(self.gpu_region, minlength=len(self.region_ids))
        self.heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.out = Outcomes(len(requests))
        self.live: dict[int, _Live] = {}
        self.by_job: dict[int, _Live] = {}
        self.queues: dict[str, deque[tuple[int, float, RouteRequest, Inputs]]] = {
            r: deque() for r in self.region_ids
        }
        self.spills = 0
        self.verdicts: dict[tuple[str, str], Verdict] = {}
        self.place_rtt: dict[tuple[int, str], float] = {}
        self.util_timeline: list[tuple[float, tuple[float, ...]]] = []
        self._busy_mark = np.zeros(len(self.gpu_list))
        if self.hier:
            self._setup_tiers()

    # ------------------------------------------------------------------ setup

    def _add_pool(self, zone_id: str, region: str, gpus: Sequence[tuple[str, str]]) -> None:
        pool = _Pool(zone_id, region, gpus, self.model)
        pool.profile = builtin_profile(self.spec.zone_profile)
        self.pools[zone_id] = pool
        self.region_pools[region].append(pool)

    def _setup_tiers(self) -> None:
        spec = profile_spec(self.policy, "global-default", DEFAULT_REQUEST_PROFILE)
        self.global_router = GlobalRouter(build(global_registry(), spec, None), spec)
        zone_urls = MappingProxyType({z: f"http://{z}.sim" for z in self.pools})
        self.regional_views = {
            r: RegionalViewBuilder(
                r, rtt=self.rtt, settings=RegionalViewSettings(zone_urls=zone_urls)
            )
            for r in self.region_ids
        }
        rspec = regional_profiles.profile_spec(self.policy)
        self.routers = {
            r: RegionalRouter(
                regional_profiles.build(rspec), saturation_filter=regional_profiles.SATURATION
            )
            for r in self.region_ids
        }
        self.zacc = {r: ZoneAccounting() for r in self.region_ids}
        self.region_summaries: dict[str, RegionSummary] = {}
        self._revision = 0
        self._tiers_tick(0.0)

    def _tiers_tick(self, now: float) -> None:
        """Publish zone summaries, rebuild regional views and region summaries, then
        the global view — what the live publishers do every second."""
        self._revision += 1
        zs = {p.zone_id: zone_summary(p.view, now) for p in self.pools.values()}
        snap = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(self.regions),
            zone_summaries=MappingProxyType(zs),
            region_summaries=MappingProxyType(dict(self.region_summaries)),
        )
        self.rviews = {}
        summaries = {}
        for r in self.region_ids:
            view = self.regional_views[r].build(snap, self.policy, now_wall=now)
            self.zacc[r].observe(view.zones)
            self.rviews[r] = view
            summaries[r] = region_summary(
                view, self.zacc[r], published_at=now, endpoints=self.regions[r].endpoints
            )
        self.region_summaries = summaries
        snap2 = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(self.regions),
            region_summaries=MappingProxyType(summaries),
        )
        health = HealthTable(self._revision, MappingProxyType({}), False)
        self.gview = build_view(self.policy, snap2, health, topology=tuple(self.regions.values()))
        # Peers' views need the fresh region summaries too (spill decisions).
        snap3 = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(self.regions),
            zone_summaries=MappingProxyType(zs),
            region_summaries=MappingProxyType(summaries),
        )
        for r in self.region_ids:
            self.rviews[r] = self.regional_views[r].build(snap3, self.policy, now_wall=now)

    # ------------------------------------------------------------------ helpers

    def _verdict(self, tenant: str, country: str) -> Verdict:
        key = (tenant, country)
        found = self.verdicts.get(key)
        if found is None:
            query = ResidencyQuery(tenant, self.model, "default", country)
            found = self.verdicts[key] = self.policy.engine.allowed_regions(query)
        return found

    def _client_rtt(self, req: SimRequest, region: str) -> float:
        key = (req.place_id, region)
        found = self.place_rtt.get(key)
        if found is None:
            km = req.point.distance_km(self.regions[region].location)
            found = self.place_rtt[key] = rtt_ms_from_distance(km)
        return found

    def _nearest(self, req: SimRequest, among: Sequence[str]) -> str | None:
        best = None
        for r in among:
            rtt = self._client_rtt(req, r)
            if best is None or rtt < best[0]:
                best = (rtt, r)
        return None if best is None else best[1]

    def _end(self, i: int, status: int, reason: str) -> None:
        out = self.out
        out.ends[i] += 1
        out.status[i] = status
        out.reason[i] = reason

    def _push_gpu(self, gpu: FastGpu) -> None:
        at = gpu.next_event_at()
        if at is not None:
            self._seq += 1
            heapq.heappush(self.heap, (at, self._seq, self.gpu_pos[id(gpu)], gpu.version))

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, i: int, pool: _Pool, now: float, extra_ms: float) -> bool:
        req = self.requests[i]
        assert pool.profile is not None
        zr = ZoneRequest(
            request_id=str(i),
            model=self.model,
            endpoint=ZoneEndpoint.COMPLETION,
            input_tokens=req.input_tokens,
            max_prompt_tokens=req.input_tokens,
            max_output_tokens=req.output_tokens,
            prefix_hashes=req.prefix_hashes,
            tokens_per_block=float(req.block_tokens),
            hash_key=req.hash_key,
            seq=pool.acc.next_seq(),
        )
        try:
            decision = pool.profile.decide(zr, pool.view)
        except (NoEligibleCandidate, ModelNotServed, RoutingError) as exc:
            self._end(i, Status.REFUSED, f"zone: {type(exc).__name__}")
            return False
        gpu = pool.gpus[decision.gpu_id]
        ticket = pool.acc.start(
            decision.gpu_id,
            prefill_tokens=decision.uncached_tokens,
            kv_blocks=math.ceil((req.input_tokens + req.output_tokens) / gpu.block_size),
            prefix_hashes=req.prefix_hashes,
            prefix_capacity=gpu.cache_capacity,
        )
        job = Job(i, req.input_tokens, max(1, req.output_tokens), req.prefix_hashes)
        live = _Live(i, job, pool, ticket, extra_ms, self.region_index[pool.region])
        self.live[i] = live
        self.out.region[i] = live.region
        if self.hier:
            self.zacc[pool.region].start(pool.zone_id, self.model, req.input_tokens)
        self._gpu_events(gpu, gpu.add(job, now), now)
        return True

    def _gpu_events(self, gpu: FastGpu, ev: GpuEvents, now: float) -> None:
        for job in ev.first_tokens:
            live = self.live[job.index]
            live.ticket.prefill_done()
            live.pool.running_tokens += job.input_tokens
            req = self.requests[job.index]
            self.out.ttft_s[job.index] = now - req.at_s + live.extra_ms / 1000.0
            self.out.cached[job.index] = job.cached_tokens
        for job in ev.finished:
            live = self.live.pop(job.index)
            live.ticket.close()
            live.pool.running_tokens -= job.input_tokens
            req = self.requests[job.index]
            self.out.e2e_s[job.index] = now - req.at_s + live.extra_ms / 1000.0
            self._end(job.index, Status.OK, "")
            if self.hier:
                self.zacc[live.pool.region].finish(live.pool.zone_id, self.model, job.input_tokens)
                self._drain_queue(live.pool.region, now)
        for job in ev.rejected:
            live = self.live.pop(job.index)
            live.ticket.close()
            if self.hier:
                self.zacc[live.pool.region].finish(live.pool.zone_id, self.model, job.input_tokens)
            self._end(job.index, Status.REFUSED, "gpu: does not fit")
        self._push_gpu(gpu)

    # ------------------------------------------------------------------ gtm path

    def _route_gtm(self, i: int, now: float) -> None:
        req = self.requests[i]
        verdict = self._verdict(req.tenant, req.country)
        if verdict.refused:
            self._end(i, Status.REFUSED, "residency")
            return
        rr = RouteRequest.model_construct(
            request_id=str(i),
            model=self.model,
            input_tokens=req.input_tokens,
            max_output_tokens=req.output_tokens,
            tenant=req.tenant,
            client=ClientInfo.model_construct(ip=None, country=req.country, location=req.point),
            data_class="default",
            priority=Priority.INTERACTIVE,
            prefix_hashes=req.prefix_hashes,
        )
        outcome = self.global_router.decide(rr, self.gview, verdict=verdict)
        if outcome.region is None:
            self._end(i, Status.REFUSED, f"global: {outcome.refusal}")
            return
        region = outcome.region
        self.out.home[i] = self.region_index[region]
        inputs = Inputs(
            allowed=verdict.allowed,
            on_saturation=verdict.on_saturation,
            client_country_known=True,
            tokens_per_block=float(req.block_tokens),
        )
        self._regional(i, rr, region, inputs, now, self._client_rtt(req, region))

    def _regional(
        self, i: int, rr: RouteRequest, region: str, inputs: Inputs, now: float, extra: float
    ) -> None:
        decision = self.routers[region].decide(
            rr, self.rviews[region], inputs, accounting=self.zacc[region], now=now, now_wall=now
        )
        if decision.route is Route.LOCAL and decision.zone is not None:
            self._dispatch(i, self.pools[decision.zone.id], now, extra)
        elif decision.route is Route.SPILL and decision.peer is not None:
            self.spills += 1
            peer = decision.peer.region
            hop = Inputs(
                allowed=inputs.allowed,
                on_saturation=inputs.on_saturation,
                hops=inputs.hops + 1,
                spilled_from=(*inputs.spilled_from, region),
                client_country_known=True,
                tokens_per_block=inputs.tokens_per_block,
            )
            self._regional(i, rr, peer, hop, now, extra + decision.peer.rtt_ms)
        elif decision.route is Route.QUEUE:
            self.queues[region].append((i, extra, rr, inputs))
        else:
            self._end(i, Status.REFUSED, f"regional: {decision.reason}")

    def _drain_queue(self, region: str, now: float) -> None:
        queue = self.queues[region]
        while queue:
            i, extra, rr, inputs = queue[0]
            if now - self.requests[i].at_s > QUEUE_TTL_S:
                queue.popleft()
                self._end(i, Status.TIMED_OUT, "queue ttl")
                continue
            placed = self.routers[region].place(
                rr, self.rviews[region], inputs, accounting=self.zacc[region]
            )
            if placed is None or placed.zone is None:
                return
            queue.popleft()
            self._dispatch(i, self.pools[placed.zone.id], now, extra)

    # ------------------------------------------------------------------ baselines

    def _route_baseline(self, i: int, now: float) -> None:
        req = self.requests[i]
        mode = self.spec.region_mode
        verdict = self._verdict(req.tenant, req.country)
        if mode is RegionMode.GEODNS:
            home = self._nearest(req, self.region_ids)
        else:
            if verdict.refused:
                self._end(i, Status.REFUSED, "residency")
                return
            home = self._nearest(req, [r for r in self.region_ids if r in verdict.allowed])
        assert home is not None
        self.out.home[i] = self.region_index[home]
        target, extra = home, self._client_rtt(req, home)
        peers = [r for r in self.region_ids if r != home and r in verdict.allowed]
        if mode is RegionMode.GORGO and peers:
            target, extra = self._gorgo(req, home, peers, extra)
        elif mode is RegionMode.SKYWALKER and peers:
            target, extra = self._skywalker(home, peers, extra)
        if target != home:
            self.spills += 1
        self._dispatch(i, self.region_pools[target][0], now, extra)

    def _gorgo_cost(self, req: SimRequest, region: str) -> tuple[float, float]:
        """(local cost ms, unmatched tokens) of ``region`` for ``req``, per GPU."""
        pool = self.region_pools[region][0]
        gpus = max(1, len(pool.gpus))
        queued = float(pool.acc.pending.sum()) / gpus
        running = pool.running_tokens / gpus
        unmatched = max(
            0.0, req.input_tokens - pool.matched_blocks(req.prefix_hashes) * req.block_tokens
        )
        return GORGO_TP_MS * (queued + 0.5 * running + unmatched), unmatched

    def _gorgo(
        self, req: SimRequest, home: str, peers: Sequence[str], extra: float
    ) -> tuple[str, float]:
        local, _ = self._gorgo_cost(req, home)
        best = (local, home, extra)
        for peer in peers:
            cost, _unmatched = self._gorgo_cost(req, peer)
            rtt = self.rtt.between(home, peer)
            # Forward iff RTT_peer + the peer's cost beats the local cost.
            if rtt + cost < best[0]:
                best = (rtt + cost, peer, extra + rtt)
        return best[1], best[2]

    def _skywalker(self, home: str, peers: Sequence[str], extra: float) -> tuple[str, float]:
        def queued_per_gpu(region: str) -> float:
            pool = self.region_pools[region][0]
            return float(pool.acc.prefilling.sum()) / max(1, len(pool.gpus))

        if queued_per_gpu(home) < SKYWALKER_PUSH_AT:
            return home, extra
        best = min(peers, key=lambda r: (queued_per_gpu(r), self.rtt.between(home, r)))
        if queued_per_gpu(best) > SKYWALKER_PEER_MAX:
            return home, extra
        return best, extra + self.rtt.between(home, best)

    # ------------------------------------------------------------------ the loop

    def run(self) -> RunResult:
        started = time.perf_counter()
        requests = self.requests
        heap = self.heap
        gpus = self.gpu_list
        route = self._route_gtm if self.hier else self._route_baseline
        next_tick = self.tick_s
        i, n = 0, len(requests)
        last_progress = 0.0
        while i < n or heap:
            t_arr = requests[i].at_s if i < n else math.inf
            t_gpu = heap[0][0] if heap else math.inf
            t_next = min(t_arr, t_gpu)
            if next_tick <= t_next and (i < n or any(self.queues.values()) or heap):
                self._tick(next_tick)
                next_tick += self.tick_s
                continue
            if t_arr <= t_gpu:
                route(i, t_arr)
                req = requests[i]
                verdict = self._verdict(req.tenant, req.country)
                region = self.out.region[i]
                if region >= 0 and self.region_ids[region] not in verdict.allowed:
                    self.out.violation[i] = True
                i += 1
                if self.progress is not None and t_arr - last_progress >= 1.0:
                    last_progress = t_arr
                    self.progress(t_arr)
            else:
                _, _, g, version = heapq.heappop(heap)
                gpu = gpus[g]
                if gpu.version != version:
                    continue
                self._gpu_events(gpu, gpu.on_event(t_gpu), t_gpu)
        end = max(self.duration_s, next_tick - self.tick_s)
        for gpu in gpus:
            gpu.advance(end)
        for region, queue in self.queues.items():
            for j, *_ in queue:
                self._end(j, Status.TIMED_OUT, "queue at end")
            queue.clear()
            del region
        return RunResult(
            policy=self.spec.name,
            outcomes=self.out,
            wall_s=time.perf_counter() - started,
            sim_s=end,
            gpu_busy_s=np.array([g.busy_s for g in gpus]),
            gpu_region=self.gpu_region,
            gpu_types=tuple(g.profile.gpu_type for g in gpus),
            max_kv_fraction=max(g.max_used_blocks / g.capacity_blocks for g in gpus),
            spills=self.spills,
            util_timeline=self.util_timeline,
            prefix_hit_tokens=sum(g.hit_tokens for g in gpus),
            prefix_queried_tokens=sum(g.queried_tokens for g in gpus),
        )

    def _tick(self, now: float) -> None:
        if self.hier:
            self._tiers_tick(now)
            for region in self.region_ids:
                if self.queues[region]:
                    self._drain_queue(region, now)
        for gpu in self.gpu_list:
            gpu.advance(now)
        busy = np.array([g.busy_s for g in self.gpu_list])
        delta = (busy - self._busy_mark) / self.tick_s
        self._busy_mark = busy
        per_region = np.bincount(self.gpu_region, weights=delta, minlength=len(self.region_ids))
        self.util_timeline.append(
            (now, tuple(float(x) for x in per_region / np.maximum(1, self.region_gpus)))
        )

"""The discrete-event fleet simulator: regions → zones → analytic GPUs, with the tiers'
own decision code in the loop.

Events: request arrivals (a pointer into the pre-built workload, identical for every
policy), messages between regions (a spilled request reaching its peer, :class:`Hop`,
half a round trip after the spill; the end of a spilled request reaching the region
that admitted it, :class:`Release`, which then finishes its quota ticket), GPU events
(:class:`~fleetsim.gpu.FastGpu` announces its next first token or completion; a
version number drops stale ones), and the summary tick (every ``tick_s``: zone
summaries → regional views and region summaries → the global view, as the live
publishers do once a second), and — with ``scrape_s`` — the zone agents' scrapes of
their GPUs. At equal times: tick, scrape, arrival, message, GPU event.

The global tier's choices depend on the global view and its in-flight ledger alone
(the ledger is charged when a request is forwarded, before the region's quota check, as
the front door charges), and regions affect each other only through messages that
take at least the shortest inter-region one-way latency: so a run's regions can be
simulated in several processes with the same outcomes (:mod:`fleetsim.partition`,
``workers``).

gtm's path per request: residency verdict (:mod:`policies`) → :class:`GlobalRouter`
``.decide`` → :class:`RegionalRouter` ``.decide`` (LOCAL / SPILL to a peer, decided again
there / QUEUE in the region's FIFO, re-placed with ``.place`` when work finishes, TTL
10 s / REFUSE) → the zone agent's :class:`ZoneProfile` ``.decide`` over a
:class:`ZoneView` whose :class:`Accounting` the simulator charges and releases exactly
as the agent does (``start`` at dispatch, ``prefill_done`` at the first token, ``close``
at the end). Network: client↔region RTT from the fitted distance model
(:func:`gtm.routing.cost.rtt_ms_from_distance`), region↔region from the measured Azure
table (:class:`regional_lb.rtt.RegionRtt`), added to TTFT and E2E.

Also in the loop for gtm: each region's tenant quotas (:class:`regional_lb.quota.QuotaLimiter`,
the example tenants' limits × ``quota_scale``) and its VTC fair queue
(:class:`regional_lb.fairqueue.FairQueue`: strict priority bands, per-band TTL, VTC
order between tenants), exactly as :mod:`regional_lb.service` drives them.

Measurement: arrivals run for ``duration_s`` (the *window*); the run then continues up
to ``drain_s`` more so that work admitted in the window can finish; whatever is still
unfinished at that horizon ends TIMED_OUT. Clients give up when no first token has come
``client_timeout_s`` after they sent the request (the job leaves the GPU's waiting
queue). GPU busy time is counted inside the window only. Faults (:class:`FaultPlan`):
a fraction of the GPUs runs slower for the whole run, and a fraction crashes at a given
time — requests on a crashed GPU FAIL, and the zone view marks it unhealthy
``detect_s`` later (until then dispatches to it fail too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from types import MappingProxyType
from typing import Protocol

import numpy as np

from fleetsim.fleet import FleetSpec, ZoneSpec
from fleetsim.gpu import FastGpu, GpuEvents, Job
from fleetsim.policies import PolicySpec, RegionMode
from fleetsim.workload import SimRequest
from global_lb.health import HealthTable
from global_lb.inflight import InflightLedger, LedgerSettings
from global_lb.keeper import build_view
from global_lb.plugins import global_registry
from global_lb.profiles import DEFAULT_REQUEST_PROFILE, build, profile_spec
from global_lb.router import GlobalRouter
from gtm.errors import ConfigError, NoEligibleCandidate, RoutingError
from gtm.gpu_profiles import get_profile
from gtm.models import (
    ClientInfo,
    Endpoint,
    GpuWorker,
    Priority,
    Region,
    RegionSummary,
    RouteRequest,
    construct_every_field,
)
from gtm.policy_store import ActivePolicy
from gtm.routing.cost import rtt_ms_from_distance
from gtm.state.snapshot import FleetSnapshot
from policies import ResidencyQuery, Verdict
from policies.documents import Quotas
from regional_lb import profiles as regional_profiles
from regional_lb.fairqueue import FairQueue, RefusalReason
from regional_lb.fastpath import FastZoneChoice
from regional_lb.quota import Cost, Grant, QuotaLimiter, Rejection, Usage, pool_of
from regional_lb.quota import Ticket as QuotaTicket
from regional_lb.router import Inputs, RegionalDecision, RegionalRouter, Route
from regional_lb.rtt import RegionRtt
from regional_lb.summary import build_summary as region_summary
from regional_lb.view import ViewBuilder as RegionalViewBuilder
from regional_lb.view import ViewSettings as RegionalViewSettings
from regional_lb.view import ZoneAccounting
from zone_agent.accounting import Accounting, SlotLoad, Ticket
from zone_agent.health import HealthStatus
from zone_agent.pipeline import ModelNotServed
from zone_agent.pipeline import ZoneProfile as GpuProfileRunner
from zone_agent.profiles import builtin_profile
from zone_agent.request import Endpoint as ZoneEndpoint
from zone_agent.request import ZoneRequest
from zone_agent.scrape import Flavor, GpuMetrics, ModelMetrics
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


#: A client gives up when no first token has come this long after it sent the request
#: (assumption: a chat UI user waits half a minute; the interactive regional queue's
#: own TTL is 10 s).
CLIENT_TIMEOUT_S = 30.0
#: How long the run goes on after the arrival window so admitted work can finish.
DRAIN_S = 60.0
#: Seconds from a GPU crash until the zone agent marks it unhealthy (assumption: a
#: couple of failed health probes at the agent's 1 s scrape).
DETECT_S = 2.0


class Status:
    OK = 0
    REFUSED = 1
    TIMED_OUT = 2
    PENDING = 3
    #: Lost on a GPU that crashed.
    FAILED = 4


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """GPU failures during a run (chosen per seed, disjoint sets)."""

    #: Fraction of the GPUs that crash at ``crash_at_s`` and stay down.
    crash_fraction: float = 0.0
    crash_at_s: float = 0.0
    #: Fraction of the GPUs that run ``slowdown`` × slower for the whole run.
    slow_fraction: float = 0.0
    slowdown: float = 2.0
    detect_s: float = DETECT_S

    @property
    def any(self) -> bool:
        return self.crash_fraction > 0 or self.slow_fraction > 0


@dataclass(frozen=True, slots=True)
class Hop:
    """A request a region spilled, on its way to the peer that decides again."""

    #: When it reaches the peer (simulated s): sent + half the round trip.
    at: float
    index: int
    region: str
    hops: int
    spilled_from: tuple[str, ...]
    #: Latency added to the request's TTFT and E2E so far (ms): the client's round trip
    #: and the way back of each hop.
    extra_ms: float
    #: The way back to the region that admitted it (ms): the one-way latencies of its
    #: hops. That region holds its quota ticket until the answer has come back through.
    back_ms: float

    @property
    def order(self) -> int:
        """Tie-break among messages for one request at one instant."""
        return self.hops


@dataclass(frozen=True, slots=True)
class Release:
    """The end of a spilled request reaches the region that admitted it, which closes
    the request's quota ticket (regional_lb.service relays the peer's answer and
    finishes the ticket when the relay ends)."""

    at: float
    index: int
    #: The admitting region.
    region: str
    usage: Usage | None
    refund: bool
    #: The time the ticket is finished at (the quota limiter's clock).
    when: float

    @property
    def order(self) -> int:
        return 1 << 30  # after any hop of the same request at the same instant


#: What travels between regions during a run, ordered by (time, request, order).
Message = Hop | Release


class SummaryLink(Protocol):
    """How a process of a partitioned run gets the region summaries of the others."""

    def share(self, mine: Mapping[str, RegionSummary]) -> dict[str, RegionSummary]:
        """Every region's summary (``mine`` and the others'), in the fleet's order."""
        ...


@dataclass(slots=True)
class _Waiting:
    """A request in a region's fair queue."""

    index: int
    extra_ms: float
    request: RouteRequest
    inputs: Inputs
    decision: RegionalDecision | None = None


@dataclass(slots=True)
class Outcomes:
    """Per-request results, as arrays indexed like the workload."""

    n: int
    status: np.ndarray = field(init=False)
    ttft_s: np.ndarray = field(init=False)
    e2e_s: np.ndarray = field(init=False)
    region: np.ndarray = field(init=False)
    gpu: np.ndarray = field(init=False)
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
        #: The GPU that served the request (its index in ``Simulator.gpu_list``), or -1.
        self.gpu = np.full(n, -1, dtype=np.int32)
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
    #: Length of the arrival window the rates and busy fractions are measured over.
    window_s: float
    #: Busy seconds of each GPU inside the window.
    gpu_busy_window_s: np.ndarray
    crashed_gpus: int
    slow_gpus: int
    util_timeline: list[tuple[float, tuple[float, ...]]]
    prefix_hit_tokens: int
    prefix_queried_tokens: int
    #: Wall seconds spent inside each tier's decision code ("global", "regional",
    #: "zone") and in publishing summaries and rebuilding views ("publish"); the rest
    #: of the run is the simulator's own work (GPU model, accounting, events).
    tier_wall_s: dict[str, float] = field(default_factory=dict)
    #: Processes that simulated the run (fleetsim.partition); ``tier_wall_s`` is
    #: summed over them.
    workers: int = 1
    #: Per worker of a partitioned run, the seconds it spent waiting for the others
    #: (at the ticks, and when it was a lookahead ahead of one).
    worker_waited_s: tuple[float, ...] = ()


#: The collector's allocation threshold for its youngest generation during a run
#: (CPython's default: 700). A run allocates steadily and makes almost no reference
#: cycles (20 objects found in a 1,000-GPU minute), so collecting every 700 net
#: allocations only re-scans live requests: at 1,000 GPUs × 60 s the collector took
#: 0.54-0.65 s of a 13-14 s run at the defaults, 0.05-0.06 s with this and the frozen
#: heap (gc.callbacks; at 180 s, 3.1 s of 45 s at the defaults).
RUN_GC_THRESHOLD = 50_000


@contextlib.contextmanager
def _run_collector() -> Iterator[None]:
    """The garbage collector tuned for a run, restored afterwards.

    Everything built before the run (the workload, the fleet, the modules) sits in the
    permanent generation (``gc.freeze``, Python docs), so the full passes a long run
    triggers do not traverse every request of the workload again each time, and
    forked workers (:mod:`fleetsim.partition`) leave those objects' pages shared;
    and the youngest generation is collected every :data:`RUN_GC_THRESHOLD`
    allocations. A heap the process froze itself is left as it is."""
    saved = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(RUN_GC_THRESHOLD, saved[1], saved[2])
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        if freeze:
            gc.unfreeze()


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
        self.states = states
        self.builder = ViewBuilder(zone_id, region)
        self.view: ZoneView = self.builder.build(states, self.acc, 0.0)
        self.profile: GpuProfileRunner | None = None
        self.running_tokens = 0.0
        #: What the last scrape saw: each GPU's (running, waiting, KV blocks) and the
        #: agent's own charges on it.
        self.last_scrape: list[tuple[tuple[int, int, int], SlotLoad]] = []

    def scrape(self, now: float, model: str) -> None:
        """The agent's scrape round at ``now``: each GPU's running and waiting requests
        and KV use as its ``/metrics`` shows them, with the agent's own charges at that
        moment (:meth:`zone_agent.app.ZoneAgent.scrape_round`), then a fresh view —
        unless nothing changed since the last scrape, when the view would be the same."""
        seen = [(self.gpus[s.id].scrape(), self.acc.at(s.id)) for s in self.states]
        if seen == self.last_scrape:
            return
        self.last_scrape = seen
        states = []
        for state, ((running, waiting, used_blocks), own) in zip(self.states, seen, strict=True):
            gpu = self.gpus[state.id]
            load = ModelMetrics(
                running=float(running),
                waiting=float(waiting),
                kv_usage=used_blocks / gpu.capacity_blocks,
                block_size=gpu.block_size,
                kv_blocks_total=gpu.capacity_blocks,
            )
            metrics = GpuMetrics(now, Flavor.VLLM, MappingProxyType({model: load}))
            states.append(dataclasses.replace(state, metrics=metrics, own_at_scrape=own))
        self.states = states
        self.view = self.builder.build(states, self.acc, now)

    def mark_down(self, gpu_id: str, now: float, reason: str) -> None:
        """The agent's health check found ``gpu_id`` dead: rebuild the view without it."""
        self.states = [
            dataclasses.replace(s, health=HealthStatus(False, reason)) if s.id == gpu_id else s
            for s in self.states
        ]
        self.view = self.builder.build(self.states, self.acc, now)

    def matched_blocks(self, hashes: tuple[int, ...]) -> int:
        # The deepest group comes last.
        groups = self.acc.prefix.match_groups(hashes)
        return groups[-1][0] if groups else 0


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
        drain_s: float = DRAIN_S,
        client_timeout_s: float = CLIENT_TIMEOUT_S,
        quota_scale: float | None = None,
        faults: FaultPlan | None = None,
        network: bool = True,
        ledger: LedgerSettings | None = None,
        regional_fast_path: bool = True,
        workers: int = 1,
        scrape_s: float | None = None,
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
        self.drain_s = drain_s
        self.client_timeout_s = client_timeout_s
        self._timeout_reason = f"client timeout: no first token in {client_timeout_s:g} s"
        self.faults = faults or FaultPlan()
        #: False: no client or inter-region RTT is added (a loopback deployment).
        self.network = network
        self.ledger_settings = ledger
        #: Regional zone choice without the trace record (regional_lb.fastpath; the same
        #: decisions, property-tested). False runs the reference profile (to compare).
        self.regional_fast_path = regional_fast_path
        #: Seconds between the zone agents' scrapes of their GPUs' metrics (running,
        #: waiting, KV use), which their decisions then weigh as the live agents do
        #: (gtm up scrapes every 0.25 s). None: no scrapes; decisions see the agents'
        #: own in-flight charges alone, which is cheaper at scale.
        if scrape_s is not None and not scrape_s > 0:
            raise ConfigError(f"the scrape interval must be > 0 s, got {scrape_s:g}")
        self.scrape_s = scrape_s
        self.scrapes = 0
        self.next_scrape = scrape_s if scrape_s is not None else math.inf
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
        self.gpu_pool = [p for p in self.pools.values() for _ in p.gpus]
        self.gpu_pos = {id(g): i for i, g in enumerate(self.gpu_list)}
        self.gpu_region = np.array(
            [self.region_index[p.region] for p in self.pools.values() for _ in p.gpus]
        )
        self.region_gpus = np.bincount(self.gpu_region, minlength=len(self.region_ids))
        self.heap: list[tuple[float, int, int, int]] = []
        #: Spilled requests on their way to a peer and ends of spilled requests on their
        #: way back: (arrival, request, order, the message).
        self.messages: list[tuple[float, int, int, Message]] = []
        #: Spilled requests: the way back (ms) and the region that admitted them.
        self.spilled: dict[int, tuple[float, str]] = {}
        self._seq = 0
        #: Worker processes for one run (fleetsim.partition; 1: this one alone).
        self.workers = workers
        #: The regions this process simulates (all of them, unless a partitioned run
        #: gave it a share) and their GPUs; messages to other regions wait in ``outbox``
        #: until the clock next moves, ``link`` swaps the region summaries at ticks.
        self.owned: frozenset[str] = frozenset(self.region_ids)
        self.owned_gpus: list[FastGpu] = self.gpu_list
        self.outbox: list[Message] = []
        self.link: SummaryLink | None = None
        #: The simulated time of the event being handled.
        self.now = 0.0
        #: The next request of the workload to arrive (to be decided, in a partitioned
        #: gtm run's worker 0).
        self.next_arrival = 0
        #: A partitioned gtm run's arrivals into this process's regions, already past
        #: the global tier: (time, request, region). ``None``: arrivals come from
        #: ``requests`` and are routed here.
        self.feed: deque[tuple[float, int, str]] | None = None
        self.out = Outcomes(len(requests))
        self.live: dict[int, _Live] = {}
        self.spills = 0
        self.verdicts: dict[tuple[str, str], Verdict] = {}
        self.place_rtt: dict[tuple[int, str], float] = {}
        self.place_home: dict[int, int] = {}
        self.place_client: dict[int, ClientInfo] = {}
        self.tier_ns = {"global": 0, "regional": 0, "zone": 0, "publish": 0}
        self.util_timeline: list[tuple[float, tuple[float, ...]]] = []
        self._busy_mark = np.zeros(len(self.gpu_list))
        self._busy_window: np.ndarray | None = None
        self.quota_tickets: dict[int, tuple[str, QuotaTicket]] = {}
        self.limiters: dict[str, QuotaLimiter] = {}
        self.bands: dict[str, Priority] = {}
        self.queues: dict[str, FairQueue[_Waiting]] = {r: FairQueue() for r in self.region_ids}
        self._plan_faults()
        # Every policy meets the same per-tenant limits: gtm's regional LBs, or for a
        # baseline the API gateway in front of each region's balancer (LiteLLM / Envoy AI
        # Gateway-style per-tenant rate limits), configured alike.
        self._setup_quotas(quota_scale)
        if self.hier:
            self._setup_tiers()

    # ------------------------------------------------------------------ setup

    def _add_pool(self, zone_id: str, region: str, gpus: Sequence[tuple[str, str]]) -> None:
        pool = _Pool(zone_id, region, gpus, self.model)
        pool.profile = builtin_profile(self.spec.zone_profile)
        self.pools[zone_id] = pool
        self.region_pools[region].append(pool)

    def _plan_faults(self) -> None:
        """Pick the crashing and the slow GPUs (same picks for every policy)."""
        plan = self.faults
        # Sorted by id so that the picks do not depend on how a policy pools its GPUs.
        order = sorted(range(len(self.gpu_list)), key=lambda k: self.gpu_list[k].gpu_id)
        rng = np.random.default_rng(self.seed + 7919)
        order = [order[k] for k in rng.permutation(len(order))]
        n_crash = round(plan.crash_fraction * len(order))
        n_slow = round(plan.slow_fraction * len(order))
        self.crash_set = order[:n_crash]
        self.slow_set = order[n_crash : n_crash + n_slow]
        for k in self.slow_set:
            self.gpu_list[k].slowdown = plan.slowdown
        self.dead: set[int] = set()
        self._crashed = self._detected = False

    def _setup_quotas(self, quota_scale: float | None) -> None:
        for name in sorted({r.tenant for r in self.requests}):
            tenant = self.policy.tenants.get(name)
            self.bands[name] = (
                Priority.INTERACTIVE if tenant is None else Priority(tenant.priority.value)
            )
            if quota_scale is None or tenant is None or tenant.quotas is None:
                continue
            quotas = scale_quotas(tenant.quotas, quota_scale)
            for region in self.region_ids:
                limiter = self.limiters.setdefault(region, QuotaLimiter())
                # One regional LB replica per region: it holds the whole pool (share 1).
                grant = Grant(1.0, math.inf, 1.0)
                limiter.configure(name, quotas, pool_of(tenant, region).fraction, grant, 0.0)

    def _admit(self, i: int, region: str, now: float) -> bool:
        """The region's quota check for request ``i`` (refused and ended when over)."""
        limiter = self.limiters.get(region)
        if limiter is None:
            return True
        req = self.requests[i]
        admitted = limiter.admit(req.tenant, Cost(req.input_tokens, req.output_tokens), now)
        if isinstance(admitted, Rejection):
            self._end(i, Status.REFUSED, f"quota: {admitted.reason.value}")
            return False
        if admitted.open:
            self.quota_tickets[i] = (region, admitted)
        return True

    def _setup_tiers(self) -> None:
        spec = profile_spec(self.policy, "global-default", DEFAULT_REQUEST_PROFILE)
        self.global_router = GlobalRouter(build(global_registry(), spec, None), spec)
        # What the global tier sent each region since its last summary (as the front door).
        self.ledger = InflightLedger(self.ledger_settings)
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
                regional_profiles.build(rspec),
                saturation_filter=regional_profiles.SATURATION,
                fast=FastZoneChoice.compile(rspec) if self.regional_fast_path else None,
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
        owned = [r for r in self.region_ids if r in self.owned]
        zs = {
            p.zone_id: zone_summary(p.view, now)
            for p in self.pools.values()
            if p.region in self.owned
        }
        snap = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(self.regions),
            zone_summaries=MappingProxyType(zs),
            region_summaries=MappingProxyType(dict(self.region_summaries)),
        )
        self.rviews = {}
        summaries = {}
        for r in owned:
            view = self.regional_views[r].build(snap, self.policy, now_wall=now)
            self.zacc[r].observe(view.zones)
            self.rviews[r] = view
            summaries[r] = region_summary(
                view, self.zacc[r], published_at=now, endpoints=self.regions[r].endpoints
            )
        if self.link is not None:
            # The other processes' regions' summaries (a partitioned run), in order.
            summaries = self.link.share(summaries)
        self.region_summaries = summaries
        snap2 = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(self.regions),
            region_summaries=MappingProxyType(summaries),
        )
        health = HealthTable(self._revision, MappingProxyType({}), False)
        # As gtm up runs the global tier: a region without a summary is down.
        self.gview = build_view(
            self.policy,
            snap2,
            health,
            topology=tuple(self.regions.values()),
            require_summaries=True,
        )
        # Peers' views need the fresh region summaries too (spill decisions).
        snap3 = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(self.regions),
            zone_summaries=MappingProxyType(zs),
            region_summaries=MappingProxyType(summaries),
        )
        for r in owned:
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
        """Client↔region RTT added to the request's latency (0 without a network)."""
        return self._fitted_rtt(req, region) if self.network else 0.0

    def _fitted_rtt(self, req: SimRequest, region: str) -> float:
        key = (req.place_id, region)
        found = self.place_rtt.get(key)
        if found is None:
            km = req.point.distance_km(self.regions[region].location)
            found = self.place_rtt[key] = rtt_ms_from_distance(km)
        return found

    def _home(self, req: SimRequest) -> int:
        """The region nearest the client (index): what cross-region is measured from."""
        found = self.place_home.get(req.place_id)
        if found is None:
            nearest = self._nearest(req, self.region_ids) or self.region_ids[0]
            found = self.place_home[req.place_id] = self.region_index[nearest]
        return found

    def _client(self, req: SimRequest) -> ClientInfo:
        found = self.place_client.get(req.place_id)
        if found is None:
            found = self.place_client[req.place_id] = ClientInfo.model_construct(
                ip=None, country=req.country, location=req.point
            )
        return found

    def _nearest(self, req: SimRequest, among: Sequence[str]) -> str | None:
        best = None
        for r in among:
            rtt = self._fitted_rtt(req, r)
            if best is None or rtt < best[0]:
                best = (rtt, r)
        return None if best is None else best[1]

    def _end(self, i: int, status: int, reason: str) -> None:
        out = self.out
        out.ends[i] += 1
        out.status[i] = status
        out.reason[i] = reason

    def _end_unserved(self, i: int, status: int, reason: str, *, ran: bool = False) -> None:
        """End a request that produced no response; refund its quota unless it ran."""
        self._close_ticket(i, None, not ran, when=self.requests[i].at_s)
        self._end(i, status, reason)

    def _close_ticket(
        self, i: int, usage: Usage | None, refund: bool, *, when: float | None = None
    ) -> None:
        """Finish request ``i``'s quota ticket, in the region that admitted it: here and
        now, or — a spilled request — when its end has travelled back there. ``when``:
        the limiter's clock for it (default: the moment the ticket is finished)."""
        spilled = self.spilled.pop(i, None)
        if spilled is None:
            held = self.quota_tickets.pop(i, None)
            if held is not None:
                clock = self.now if when is None else when
                self.limiters[held[0]].finish(held[1], clock, usage=usage, refund=refund)
            return
        if not self.limiters:
            return
        back_ms, origin = spilled
        at = self.now + back_ms / 1000.0
        self._send(Release(at, i, origin, usage, refund, at if when is None else when))

    def _on_release(self, release: Release) -> None:
        held = self.quota_tickets.pop(release.index, None)
        if held is not None:
            self.limiters[held[0]].finish(
                held[1], release.when, usage=release.usage, refund=release.refund
            )

    def _push_gpu(self, gpu: FastGpu, now: float) -> None:
        at = gpu.next_event_at()
        if at is not None:
            # Never in the past: the GPU's arithmetic may land a due event an ulp before
            # ``now``, and a partitioned run has told the others it is done before now.
            if at < now:
                at = now
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
            t0 = perf_counter_ns()
            decision = pool.profile.decide(zr, pool.view)
            self.tier_ns["zone"] += perf_counter_ns() - t0
        except (NoEligibleCandidate, ModelNotServed, RoutingError) as exc:
            self._end_unserved(i, Status.REFUSED, f"zone: {type(exc).__name__}")
            return False
        gpu = pool.gpus[decision.gpu_id]
        self.out.region[i] = self.region_index[pool.region]
        if pool.region not in self._verdict(req.tenant, req.country).allowed:
            self.out.violation[i] = True
        self.out.gpu[i] = self.gpu_pos[id(gpu)]
        if self.gpu_pos[id(gpu)] in self.dead:
            # Crashed and not yet detected: the connection is refused.
            self._end_unserved(i, Status.FAILED, "gpu crashed (not yet detected)")
            return False
        ticket = pool.acc.start(
            decision.gpu_id,
            prefill_tokens=decision.uncached_tokens,
            kv_blocks=math.ceil((req.input_tokens + req.output_tokens) / gpu.block_size),
            prefix_hashes=req.prefix_hashes,
            prefix_capacity=gpu.cache_capacity,
        )
        job = Job(i, req.input_tokens, max(1, req.output_tokens), req.prefix_hashes)
        job.deadline = req.at_s + self.client_timeout_s
        live = _Live(i, job, pool, ticket, extra_ms, self.region_index[pool.region])
        self.live[i] = live
        if self.hier:
            self.zacc[pool.region].start(pool.zone_id, self.model, req.input_tokens)
        self._gpu_events(gpu, gpu.add(job, now), now)
        return True

    def _release(self, live: _Live, now: float) -> None:
        """Give back what the agent and the regional LB charged for ``live``."""
        live.ticket.close()
        if self.hier:
            self.zacc[live.pool.region].finish(live.pool.zone_id, self.model, live.job.input_tokens)

    def _gpu_events(self, gpu: FastGpu, ev: GpuEvents, now: float) -> None:
        for job in ev.first_tokens:
            live = self.live[job.index]
            live.ticket.prefill_done()
            live.pool.running_tokens += job.input_tokens
            req = self.requests[job.index]
            self.out.ttft_s[job.index] = now - req.at_s + live.extra_ms / 1000.0
            self.out.cached[job.index] = job.cached_tokens
        regions_freed: set[str] = set()
        for job in ev.finished:
            live = self.live.pop(job.index)
            live.pool.running_tokens -= job.input_tokens
            self._release(live, now)
            req = self.requests[job.index]
            self.out.e2e_s[job.index] = now - req.at_s + live.extra_ms / 1000.0
            self._close_ticket(job.index, Usage(req.input_tokens, req.output_tokens), False)
            self._end(job.index, Status.OK, "")
            regions_freed.add(live.pool.region)
        for job in ev.rejected:
            live = self.live.pop(job.index)
            self._release(live, now)
            self._end_unserved(job.index, Status.REFUSED, "gpu: does not fit")
            regions_freed.add(live.pool.region)
        for job in ev.expired:
            live = self.live.pop(job.index)
            self._release(live, now)
            self._end_unserved(job.index, Status.TIMED_OUT, self._timeout_reason)
            regions_freed.add(live.pool.region)
        self._push_gpu(gpu, now)
        if self.hier:
            for region in regions_freed:
                if len(self.queues[region]):
                    self._drain_queue(region, now)

    # ------------------------------------------------------------------ gtm path

    def _route_gtm(self, i: int, now: float, verdict: Verdict) -> None:
        rr = self._route_request(i)
        region = self.decide_region(i, rr, now, verdict)
        if region is not None and region in self.owned:
            self.enter_region(i, rr, region, now, verdict)

    def decide_region(self, i: int, rr: RouteRequest, now: float, verdict: Verdict) -> str | None:
        """The global tier's choice for request ``i`` (``None``: refused and ended)."""
        if verdict.refused:
            self._end(i, Status.REFUSED, "residency")
            return None
        t0 = perf_counter_ns()
        view = self.ledger.view(self.gview, now)
        outcome = self.global_router.decide(rr, view, verdict=verdict)
        self.tier_ns["global"] += perf_counter_ns() - t0
        if outcome.region is None:
            self._end(i, Status.REFUSED, f"global: {outcome.refusal}")
            return None
        # Charged as the front door charges a forward: before the region's own checks.
        # (Its quota refusal would come back a round trip later and take the charge
        # back; here the charge stays until the region's next summary, at most a tick.
        # Global decisions so depend on nothing a region decides, which is what lets
        # the regions of one run be simulated in parallel: fleetsim.partition.)
        self.ledger.charge(outcome.region, self.model, rr.input_tokens, now)
        return outcome.region

    def enter_region(
        self, i: int, rr: RouteRequest | None, region: str, now: float, verdict: Verdict
    ) -> None:
        """Request ``i`` reaches ``region``'s regional LB: quota, then its decision."""
        if not self._admit(i, region, now):
            return
        req = self.requests[i]
        inputs = Inputs(
            allowed=verdict.allowed,
            on_saturation=verdict.on_saturation,
            client_country_known=True,
            tokens_per_block=float(req.block_tokens),
        )
        if rr is None:
            rr = self._route_request(i)
        self._regional(i, rr, region, inputs, now, self._client_rtt(req, region))

    def _route_request(self, i: int) -> RouteRequest:
        req = self.requests[i]
        return construct_every_field(
            RouteRequest,
            {
                "request_id": str(i),
                "model": self.model,
                "input_tokens": req.input_tokens,
                "max_output_tokens": req.output_tokens,
                "tenant": req.tenant,
                "client": self._client(req),
                "data_class": "default",
                "priority": self.bands.get(req.tenant, Priority.INTERACTIVE),
                "prefix_hashes": req.prefix_hashes,
            },
        )

    def _on_hop(self, hop: Hop) -> None:
        """A spilled request reaches the peer region, which decides again."""
        i = hop.index
        req = self.requests[i]
        self.spilled[i] = (hop.back_ms, hop.spilled_from[0])
        verdict = self._verdict(req.tenant, req.country)
        inputs = Inputs(
            allowed=verdict.allowed,
            on_saturation=verdict.on_saturation,
            hops=hop.hops,
            spilled_from=hop.spilled_from,
            client_country_known=True,
            tokens_per_block=float(req.block_tokens),
        )
        self._regional(i, self._route_request(i), hop.region, inputs, hop.at, hop.extra_ms)

    def _send(self, message: Message) -> None:
        if message.at > self.duration_s + self.drain_s:
            if isinstance(message, Hop):
                # It would reach its peer after the run: it ends here, as what the
                # horizon cut off (no region has it to end it later).
                self._end_unserved(message.index, Status.TIMED_OUT, "in flight at the horizon")
            return  # (a release after the run changes nothing the run reports)
        if message.region in self.owned:
            heapq.heappush(self.messages, (message.at, message.index, message.order, message))
        else:
            self.outbox.append(message)

    def _on_message(self, message: Message) -> None:
        if isinstance(message, Hop):
            self._on_hop(message)
        else:
            self._on_release(message)

    def _regional(
        self, i: int, rr: RouteRequest, region: str, inputs: Inputs, now: float, extra: float
    ) -> None:
        t0 = perf_counter_ns()
        decision = self.routers[region].decide(
            rr,
            self.rviews[region],
            inputs,
            accounting=self.zacc[region],
            now=now,
            now_wall=now,
            trace=False,
        )
        self.tier_ns["regional"] += perf_counter_ns() - t0
        if decision.route is Route.LOCAL and decision.zone is not None:
            self._dispatch(i, self.pools[decision.zone.id], now, extra)
        elif decision.route is Route.SPILL and decision.peer is not None:
            self.spills += 1
            # The request travels to the peer (half the round trip) and is decided
            # again there; the answer's way back is added to its latency.
            one_way_ms = decision.peer.rtt_ms / 2.0 if self.network else 0.0
            # The way back so far; the peer keeps it from here (it is where the
            # request ends, or spills again).
            back_ms = self.spilled.pop(i, (0.0, ""))[0]
            self._send(
                Hop(
                    now + one_way_ms / 1000.0,
                    i,
                    decision.peer.region,
                    inputs.hops + 1,
                    (*inputs.spilled_from, region),
                    extra + one_way_ms,
                    back_ms + one_way_ms,
                )
            )
        elif decision.route is Route.QUEUE:
            req = self.requests[i]
            offered = self.queues[region].offer(
                req.tenant,
                rr.priority,
                _Waiting(i, extra, rr, inputs),
                input_tokens=req.input_tokens,
                output_tokens=req.output_tokens,
                now=now,
            )
            if isinstance(offered, RefusalReason):
                self._end_unserved(i, Status.REFUSED, f"regional queue: {offered.value}")
            else:
                self._drain_queue(region, now)
        else:
            self._end_unserved(i, Status.REFUSED, f"regional: {decision.reason}")

    def _drain_queue(self, region: str, now: float) -> None:
        """Expire, then hand queued requests to zones with room (regional_lb.service)."""
        queue = self.queues[region]
        for expired in queue.expire(now):
            self._end_unserved(expired.payload.index, Status.TIMED_OUT, "regional queue ttl")
        gave_up = [
            item
            for item in queue.items()
            if self.requests[item.payload.index].at_s + self.client_timeout_s <= now
        ]
        for item in gave_up:
            # The client went away while waiting (regional_lb.service removes it too).
            queue.remove(item)
            self._end_unserved(item.payload.index, Status.TIMED_OUT, self._timeout_reason)
        if not len(queue):
            return
        router, view, acc = self.routers[region], self.rviews[region], self.zacc[region]
        full = False

        def placeable(waiting: _Waiting) -> bool:
            nonlocal full
            if full:
                return False
            waiting.decision = router.place(
                waiting.request, view, waiting.inputs, accounting=acc, trace=False
            )
            full = waiting.decision is None or waiting.decision.zone is None
            return not full

        while (popped := queue.pop(placeable)) is not None:
            waiting = popped.payload
            zone = waiting.decision.zone if waiting.decision is not None else None
            assert zone is not None
            self._dispatch(waiting.index, self.pools[zone.id], now, waiting.extra_ms)

    # ------------------------------------------------------------------ baselines

    def baseline_region(self, req: SimRequest) -> str | None:
        """The region a baseline sends ``req`` to before any cross-region rule: the
        nearest (GeoDNS), or the nearest its residency allows (``None``: none)."""
        if self.spec.region_mode is RegionMode.GEODNS:
            return self._nearest(req, self.region_ids)
        verdict = self._verdict(req.tenant, req.country)
        if verdict.refused:
            return None
        return self._nearest(req, [r for r in self.region_ids if r in verdict.allowed])

    def _route_baseline(self, i: int, now: float, verdict: Verdict) -> None:
        req = self.requests[i]
        mode = self.spec.region_mode
        if mode is not RegionMode.GEODNS and verdict.refused:
            self._end(i, Status.REFUSED, "residency")
            return
        home = self.baseline_region(req)
        assert home is not None
        target, extra = home, self._client_rtt(req, home)
        peers = [r for r in self.region_ids if r != home and r in verdict.allowed]
        if mode is RegionMode.GORGO and peers:
            target, extra = self._gorgo(req, home, peers, extra)
        elif mode is RegionMode.SKYWALKER and peers:
            target, extra = self._skywalker(home, peers, extra)
        if target not in self.owned:
            return
        if target != home:
            self.spills += 1
        if self._admit(i, target, now):
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
        """Simulate the whole run: here, or over :attr:`workers` processes when the
        policy's regions can be simulated apart (:mod:`fleetsim.partition`); the
        outcomes are the same either way."""
        started = time.perf_counter()
        with _run_collector():
            return self._run(started)

    def _run(self, started: float) -> RunResult:
        if self.workers > 1:
            from fleetsim.partition import plan_partition, run_partitioned

            plan = plan_partition(self, self.workers)
            if plan is not None:
                return run_partitioned(self, plan, started)
        next_tick = self.advance(math.inf, inclusive=True, next_tick=self.tick_s, ticks=True)
        return self.finish(started, next_tick)

    def advance(
        self,
        barrier: float,
        *,
        inclusive: bool,
        next_tick: float,
        ticks: bool,
        publish: Callable[[float], None] | None = None,
    ) -> float:
        """Process the events before ``barrier`` (at it too if ``inclusive``) and never
        past the horizon; with ``ticks``, the summary ticks due on the way as well.
        Returns the time of the next tick not yet run.

        Order at equal times: a tick, then the zone agents' scrapes, then an arrival,
        then a message between regions (by request, then kind), then a GPU event —
        whichever process simulates which regions.
        """
        requests = self.requests
        heap, messages = self.heap, self.messages
        gpus = self.gpu_list
        route = self._route_gtm if self.hier else self._route_baseline
        home = self.out.home
        horizon = self.duration_s + self.drain_s
        if barrier > horizon:
            barrier, inclusive = horizon, True
        inf = math.inf
        i, n = self.next_arrival, len(requests)
        feed = self.feed
        if feed is not None:
            # Partitioned gtm run: the global tier's choices, made by worker 0, for the
            # requests entering this process's regions (fleetsim.partition).
            requests, n = (), 0
        try:
            while True:
                if feed is None:
                    t_arr = requests[i].at_s if i < n else inf
                else:
                    t_arr = feed[0][0] if feed else inf
                t_msg = messages[0][0] if messages else inf
                t_gpu = heap[0][0] if heap else inf
                t_next = t_arr if t_arr < t_msg else t_msg
                if t_gpu < t_next:
                    t_next = t_gpu
                t_scrape = self.next_scrape
                if t_scrape < t_next:
                    t_next = t_scrape
                if ticks and next_tick <= t_next and next_tick <= horizon and self.busy(i):
                    self.next_arrival = i
                    self.tick(next_tick)
                    next_tick += self.tick_s
                    continue
                if t_next > barrier or (t_next == barrier and not inclusive):
                    return next_tick
                if publish is not None:
                    # Everything before t_next is done (a partitioned run's progress).
                    publish(t_next)
                if t_scrape <= t_next:
                    self.now = t_scrape
                    self._scrape(t_scrape)
                    continue
                if t_arr <= t_msg and t_arr <= t_gpu:
                    if feed is not None:
                        self.now = t_arr
                        self._enter_fed(*feed.popleft())
                        continue
                    req = requests[i]
                    # The nearest region to the client: what "cross-region" is measured from.
                    home[i] = self._home(req)
                    self.now = t_arr
                    route(i, t_arr, self._verdict(req.tenant, req.country))
                    i += 1
                elif t_msg <= t_gpu:
                    self.now = t_msg
                    self._on_message(heapq.heappop(messages)[3])
                else:
                    _, _, g, version = heapq.heappop(heap)
                    gpu = gpus[g]
                    if gpu.version == version:
                        self.now = t_gpu
                        self._gpu_events(gpu, gpu.on_event(t_gpu), t_gpu)
        finally:
            if feed is None:
                self.next_arrival = i

    def _scrape(self, now: float) -> None:
        """Every zone agent of this process's regions scrapes its GPUs."""
        assert self.scrape_s is not None
        self.scrapes += 1
        self.next_scrape = (self.scrapes + 1) * self.scrape_s
        for pool in self.pools.values():
            if pool.region in self.owned:
                pool.scrape(now, self.model)

    def _enter_fed(self, at: float, i: int, region: str) -> None:
        req = self.requests[i]
        self.out.home[i] = self._home(req)
        self.enter_region(i, None, region, at, self._verdict(req.tenant, req.country))

    def decide_until(
        self, barrier: float, inclusive: bool, workers: int, worker_of: Mapping[str, int]
    ) -> list[list[tuple[float, int, str]]]:
        """The global tier's choices for the arrivals before ``barrier`` (at it too if
        ``inclusive``): per worker of a partitioned run, those entering its regions."""
        feeds: list[list[tuple[float, int, str]]] = [[] for _ in range(workers)]
        requests, home = self.requests, self.out.home
        i, n = self.next_arrival, len(requests)
        while i < n:
            req = requests[i]
            at = req.at_s
            if at > barrier or (at == barrier and not inclusive):
                break
            # The nearest region to the client: what "cross-region" is measured from.
            home[i] = self._home(req)
            verdict = self._verdict(req.tenant, req.country)
            region = self.decide_region(i, self._route_request(i), at, verdict)
            if region is not None:
                feeds[worker_of[region]].append((at, i, region))
            i += 1
        self.next_arrival = i
        return feeds

    def busy(self, next_arrival: int | None = None) -> bool:
        """Whether anything is left to simulate here (the summary ticks run while so)."""
        i = self.next_arrival if next_arrival is None else next_arrival
        return bool(
            i < len(self.requests)
            or self.feed
            or self.heap
            or self.messages
            or self.outbox
            or self.live
            or self._queued()
        )

    def finish(self, started: float, next_tick: float) -> RunResult:
        """End the run (what the horizon cut off) and gather this process's results."""
        window = self.duration_s
        horizon = window + self.drain_s
        end = min(horizon, max(window, next_tick - self.tick_s))
        self._capture_window(window)
        gpus = self.owned_gpus
        for gpu in gpus:
            gpu.advance(end)
        self._finish_leftovers(self.next_arrival)
        busy_window = self._busy_window
        assert busy_window is not None
        everyone = self.gpu_list
        return RunResult(
            policy=self.spec.name,
            outcomes=self.out,
            wall_s=time.perf_counter() - started,
            tier_wall_s={k: v / 1e9 for k, v in self.tier_ns.items()},
            sim_s=end,
            gpu_busy_s=np.array([g.busy_s for g in everyone]),
            gpu_region=self.gpu_region,
            gpu_types=tuple(g.profile.gpu_type for g in everyone),
            max_kv_fraction=max((g.max_used_blocks / g.capacity_blocks for g in gpus), default=0.0),
            spills=self.spills,
            util_timeline=self.util_timeline,
            prefix_hit_tokens=sum(g.hit_tokens for g in gpus),
            prefix_queried_tokens=sum(g.queried_tokens for g in gpus),
            window_s=window,
            gpu_busy_window_s=busy_window,
            crashed_gpus=len(self.crash_set),
            slow_gpus=len(self.slow_set),
        )

    def _queued(self) -> bool:
        return any(len(q) for q in self.queues.values())

    def _finish_leftovers(self, next_arrival: int) -> None:
        """End what the horizon cut off: still on a GPU, still queued, never arrived."""
        self.now = self.duration_s + self.drain_s
        for index in sorted(self.live):
            self._release(self.live[index], self.duration_s + self.drain_s)
            self._end_unserved(index, Status.TIMED_OUT, "unfinished at the horizon", ran=True)
        self.live.clear()
        for queue in self.queues.values():
            while (item := queue.pop()) is not None:
                self._end_unserved(item.payload.index, Status.TIMED_OUT, "queued at the horizon")
        for index in range(next_arrival, len(self.requests)):
            self._end(index, Status.TIMED_OUT, "arrived after the horizon")

    def _capture_window(self, now: float) -> None:
        if self._busy_window is None:
            for gpu in self.owned_gpus:
                gpu.advance(now)
            self._busy_window = np.array([g.busy_s for g in self.gpu_list])

    def tick(self, now: float) -> None:
        """The summary tick at ``now``: faults due, summaries and views, GPU timeouts,
        queued requests placed, the utilisation timeline."""
        self.now = now
        if self._busy_window is None and now >= self.duration_s:
            self._capture_window(self.duration_s)
        self._faults_tick(now)
        if self.hier:
            t0 = perf_counter_ns()
            self._tiers_tick(now)
            self.tier_ns["publish"] += perf_counter_ns() - t0
        for gpu in self.owned_gpus:
            if gpu.waiting or gpu.prefill:
                ev = gpu.expire(now)
                if ev.expired or ev.rejected:
                    self._gpu_events(gpu, ev, now)
            else:
                gpu.advance(now)
        if self.hier:
            for region in self.region_ids:
                if len(self.queues[region]):
                    self._drain_queue(region, now)
        busy = np.array([g.busy_s for g in self.gpu_list])
        delta = (busy - self._busy_mark) / self.tick_s
        self._busy_mark = busy
        per_region = np.bincount(self.gpu_region, weights=delta, minlength=len(self.region_ids))
        self.util_timeline.append(
            (now, tuple(float(x) for x in per_region / np.maximum(1, self.region_gpus)))
        )
        if self.progress is not None:
            self.progress(now)

    def _faults_tick(self, now: float) -> None:
        plan = self.faults
        if self.crash_set and not self._crashed and now >= plan.crash_at_s:
            self._crashed = True
            for k in self.crash_set:
                if self.gpu_pool[k].region not in self.owned:
                    continue
                self.dead.add(k)
                for job in self.gpu_list[k].crash(now):
                    live = self.live.pop(job.index)
                    self._release(live, now)
                    if job.first_token_at >= 0:
                        live.pool.running_tokens -= job.input_tokens
                    self._end_unserved(job.index, Status.FAILED, "gpu crashed", ran=True)
        if self._crashed and not self._detected and now >= plan.crash_at_s + plan.detect_s:
            self._detected = True
            for k in self.crash_set:
                if self.gpu_pool[k].region in self.owned:
                    self.gpu_pool[k].mark_down(self.gpu_list[k].gpu_id, now, "crashed")


def scale_quotas(quotas: Quotas, scale: float) -> Quotas:
    """``quotas`` with every limit multiplied by ``scale`` (the weight kept)."""
    update = {
        name: max(1, round(value * scale))
        for name, value in quotas.model_dump().items()
        if name != "output_weight" and value is not None
    }
    return quotas.model_copy(update=update)

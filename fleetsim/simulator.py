"""The discrete-event fleet simulator's event loop: regions → zones → analytic GPUs, with
a policy's decisions in the loop.

The loop owns time, the GPUs, the arrivals and the accounting; the decisions belong to
the policy's :class:`~fleetsim.routing.Routing` — gtm's tiers (:mod:`fleetsim.tiers`)
or a cross-region baseline (:mod:`fleetsim.baselines`) — which the policy's
:class:`~fleetsim.policies.PolicySpec` selects (:func:`routing_for`).

Events: request arrivals (a pointer into the pre-built workload, identical for every
policy), messages between regions (:mod:`fleetsim.events`: a spilled request reaching
its peer half a round trip after the spill; the end of a spilled request reaching the
region that admitted it, which then finishes its quota ticket), GPU events
(:class:`~fleetsim.gpu.FastGpu` announces its next first token or completion; a version
number drops stale ones), the summary tick (every ``tick_s``: the routing publishes,
queued requests are placed) and — with ``scrape_s`` — the zone agents' scrapes of their
GPUs. At equal times: tick, scrape, arrival, message, GPU event.

Regions affect each other only through messages that take at least the shortest
inter-region one-way latency, and a global tier's choices depend on its own state
alone: so a run's regions can be simulated in several processes with the same
outcomes (:mod:`fleetsim.partition`, ``workers``).

The loop charges and releases each zone agent's :class:`~zone_agent.accounting.Accounting`
exactly as the agent does (``start`` at dispatch, ``prefill_done`` at the first token,
``close`` at the end). Network: client↔region RTT from the fitted distance model
(:func:`gtm.routing.cost.rtt_ms_from_distance`), region↔region from the measured Azure
table (:class:`regional_lb.rtt.RegionRtt`), added to TTFT and E2E. Every policy meets
the same per-tenant quotas (:class:`regional_lb.quota.QuotaLimiter`, the example
tenants' limits × ``quota_scale``), checked in the region a request enters.

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
import gc
import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter_ns

import numpy as np

from fleetsim.baselines import region_policy
from fleetsim.clients import Clients
from fleetsim.events import Hop, Message, Release, SummaryLink
from fleetsim.fleet import FleetSpec, ZoneSpec
from fleetsim.gpu import FastGpu, GpuEvents, Job
from fleetsim.policies import PolicySpec, RegionMode
from fleetsim.pools import Live, Pool
from fleetsim.results import Outcomes, RunResult, Status
from fleetsim.routing import Baseline, Routing
from fleetsim.tiers import Tiers
from fleetsim.workload import SimRequest
from global_lb.inflight import LedgerSettings
from gtm.errors import ConfigError, NoEligibleCandidate, RoutingError
from gtm.models import Endpoint, Priority, Region
from gtm.policy_store import ActivePolicy
from policies.documents import Quotas
from regional_lb.quota import Cost, Grant, QuotaLimiter, Rejection, Usage, pool_of
from regional_lb.quota import Ticket as QuotaTicket
from regional_lb.rtt import RegionRtt
from zone_agent.errors import ModelNotServed, NoCapacity
from zone_agent.flow import GO, Admission, Plan, check_profile
from zone_agent.profiles import builtin_profile
from zone_agent.request import Endpoint as ZoneEndpoint
from zone_agent.request import ZoneRequest

__all__ = [
    "CLIENT_TIMEOUT_S",
    "DRAIN_S",
    "FaultPlan",
    "Hop",
    "Message",
    "Outcomes",
    "Release",
    "RunResult",
    "Simulator",
    "Status",
    "routing_for",
    "scale_quotas",
]

#: A client gives up when no first token has come this long after it sent the request
#: (assumption: a chat UI user waits half a minute; the interactive regional queue's
#: own TTL is 10 s).
CLIENT_TIMEOUT_S = 30.0
#: How long the run goes on after the arrival window so admitted work can finish.
DRAIN_S = 60.0
#: Seconds from a GPU crash until the zone agent marks it unhealthy (assumption: a
#: couple of failed health probes at the agent's 1 s scrape).
DETECT_S = 2.0


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


def routing_for(spec: PolicySpec) -> Routing:
    """The decisions ``spec`` names: gtm's tiers, or a cross-region baseline."""
    if spec.region_mode is RegionMode.GTM:
        return Tiers()
    return Baseline(region_policy(spec.region_mode))


#: The collector's allocation threshold for its youngest generation during a run
#: (CPython's default: 700). A run allocates steadily and makes almost no reference
#: cycles, so collecting every 700 net allocations only re-scans live requests.
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
        self.timeout_reason = f"client timeout: no first token in {client_timeout_s:g} s"
        self.faults = faults or FaultPlan()
        #: False: no client or inter-region RTT is added (a loopback deployment).
        self.network = network
        self.ledger_settings = ledger
        #: Regional decisions without their trace record (the same choices,
        #: property-tested). False builds every trace, as the reference path (to compare).
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
        #: The policy's decisions (gtm's tiers or a baseline); set up last, over the pools.
        self.routing = routing_for(spec)
        self.pools: dict[str, Pool] = {}
        self.region_pools: dict[str, list[Pool]] = {r: [] for r in self.region_ids}
        for region in fleet.regions:
            zones: Sequence[ZoneSpec] = region.zones
            if self.routing.ZONE_POOLS:
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
        #: run's worker 0).
        self.next_arrival = 0
        #: A partitioned run's arrivals into this process's regions, already past the
        #: global tier: (time, request, region). ``None``: arrivals come from
        #: ``requests`` and are routed here.
        self.feed: deque[tuple[float, int, str]] | None = None
        self.out = Outcomes(len(requests))
        self.live: dict[int, Live] = {}
        self.spills = 0
        #: Residency verdicts, round trips and nearest regions, per client place.
        self.clients = Clients(policy, model, self.regions, network)
        self.tier_ns = {"global": 0, "regional": 0, "zone": 0, "publish": 0}
        self.util_timeline: list[tuple[float, tuple[float, ...]]] = []
        self._busy_mark = np.zeros(len(self.gpu_list))
        self._busy_window: np.ndarray | None = None
        self.quota_tickets: dict[int, tuple[str, QuotaTicket]] = {}
        self.limiters: dict[str, QuotaLimiter] = {}
        self.bands: dict[str, Priority] = {}
        self._plan_faults()
        # Every policy meets the same per-tenant limits: gtm's regional LBs, or for a
        # baseline the API gateway in front of each region's balancer (LiteLLM / Envoy AI
        # Gateway-style per-tenant rate limits), configured alike.
        self._setup_quotas(quota_scale)
        self.routing.attach(self)

    # ------------------------------------------------------------------ setup

    def _add_pool(self, zone_id: str, region: str, gpus: Sequence[tuple[str, str]]) -> None:
        pool = Pool(zone_id, region, gpus, self.model, builtin_profile(self.spec.zone_profile))
        if self.spec.admission is not None:
            check_profile(pool.profile)
            pool.admission = Admission(self.spec.admission)
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

    # ------------------------------------------------------------------ accounting

    def admit(self, i: int, region: str, now: float) -> bool:
        """The region's quota check for request ``i`` (refused and ended when over)."""
        limiter = self.limiters.get(region)
        if limiter is None:
            return True
        req = self.requests[i]
        admitted = limiter.admit(req.tenant, Cost(req.input_tokens, req.output_tokens), now)
        if isinstance(admitted, Rejection):
            self.end(i, Status.REFUSED, f"quota: {admitted.reason.value}")
            return False
        if admitted.open:
            self.quota_tickets[i] = (region, admitted)
        return True

    def end(self, i: int, status: int, reason: str) -> None:
        """Record request ``i``'s end."""
        out = self.out
        out.ends[i] += 1
        out.status[i] = status
        out.reason[i] = reason

    def end_unserved(self, i: int, status: int, reason: str, *, ran: bool = False) -> None:
        """End a request that produced no response; refund its quota unless it ran."""
        self._close_ticket(i, None, not ran, when=self.requests[i].at_s)
        self.end(i, status, reason)

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
        self.send(Release(at, i, origin, usage, refund, at if when is None else when))

    def _on_release(self, release: Release) -> None:
        held = self.quota_tickets.pop(release.index, None)
        if held is not None:
            self.limiters[held[0]].finish(
                held[1], release.when, usage=release.usage, refund=release.refund
            )

    def send(self, message: Message) -> None:
        """Send a message between regions (here, or to the process that owns its region)."""
        if message.at > self.duration_s + self.drain_s:
            if isinstance(message, Hop):
                # It would reach its peer after the run: it ends here, as what the
                # horizon cut off (no region has it to end it later).
                self.end_unserved(message.index, Status.TIMED_OUT, "in flight at the horizon")
            return  # (a release after the run changes nothing the run reports)
        if message.region in self.owned:
            heapq.heappush(self.messages, (message.at, message.index, message.order, message))
        else:
            self.outbox.append(message)

    def _on_message(self, message: Message) -> None:
        if isinstance(message, Hop):
            self.routing.on_hop(message)
        else:
            self._on_release(message)

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

    def dispatch(self, i: int, pool: Pool, now: float, extra_ms: float) -> bool:
        """The zone agent of ``pool`` picks request ``i``'s GPU, which gets it; ``extra_ms``:
        network latency added to its TTFT and E2E. With flow control on, the agent may
        hold it first (:meth:`_send_held` sends it on)."""
        req = self.requests[i]
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
        admission = pool.admission
        if admission is None:
            return self._send(i, zr, pool, now, extra_ms, GO)
        t0 = perf_counter_ns()
        plan = admission.plan(zr, pool.view, pool.profile) if not admission.waiting else None
        self.tier_ns["zone"] += perf_counter_ns() - t0
        if plan is not None:
            return self._send(i, zr, pool, now, extra_ms, plan)
        try:
            admission.hold((i, extra_ms), zr, now)
        except NoCapacity:
            self.end_unserved(i, Status.REFUSED, "zone: flow control's queue is full")
        return False

    def _send_held(self, pool: Pool, now: float) -> None:
        """Send on whoever ``pool``'s flow control lets go now (one at a time: each
        charge changes the picture)."""
        admission = pool.admission
        if admission is None or not admission.waiting:
            return
        while True:
            t0 = perf_counter_ns()
            went = admission.release(now, pool.view, pool.profile)
            self.tier_ns["zone"] += perf_counter_ns() - t0
            if went is None:
                return
            held, plan, _ = went
            i, extra_ms = held.item
            self._send(i, held.request, pool, now, extra_ms, plan)

    def _send(
        self,
        i: int,
        zr: ZoneRequest,
        pool: Pool,
        now: float,
        extra_ms: float,
        plan: Plan,
    ) -> bool:
        """Send request ``i`` to the zone's choice: flow control's (``plan``, made now on
        this view) or a decision excluding the GPUs the plan does."""
        req = self.requests[i]
        try:
            t0 = perf_counter_ns()
            decided = plan.decision
            if decided is None:
                decided = pool.profile.decide(zr, pool.view, not_admitted=plan.exclude)
            decision = self.routing.zone_choice(decided)
            self.tier_ns["zone"] += perf_counter_ns() - t0
        except (NoEligibleCandidate, ModelNotServed, RoutingError) as exc:
            self.end_unserved(i, Status.REFUSED, f"zone: {type(exc).__name__}")
            return False
        gpu = pool.gpus[decision.gpu_id]
        self.out.region[i] = self.region_index[pool.region]
        if pool.region not in self.clients.verdict(req.tenant, req.country).allowed:
            self.out.violation[i] = True
        self.out.gpu[i] = self.gpu_pos[id(gpu)]
        if self.gpu_pos[id(gpu)] in self.dead:
            # Crashed and not yet detected: the connection is refused.
            self.end_unserved(i, Status.FAILED, "gpu crashed (not yet detected)")
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
        live = Live(i, job, pool, ticket, extra_ms, self.region_index[pool.region])
        if pool.admission is not None:
            live.guard = pool.admission.dispatched(decision)
        self.live[i] = live
        if pool.regional is not None:
            pool.regional.start(pool.zone_id, self.model, req.input_tokens)
        self._gpu_events(gpu, gpu.add(job, now), now)
        return True

    def _release(self, live: Live, now: float) -> None:
        """Give back what the agent and the regional LB charged for ``live``."""
        live.ticket.close()
        if live.guard is not None:
            live.guard.close()
        pool = live.pool
        if pool.regional is not None:
            pool.regional.finish(pool.zone_id, self.model, live.job.input_tokens)

    def _gpu_events(self, gpu: FastGpu, ev: GpuEvents, now: float) -> None:
        held_by: Pool | None = None  # a pool whose flow control may now send on
        for job in ev.first_tokens:
            live = self.live[job.index]
            held_by = live.pool
            live.ticket.prefill_done()
            live.pool.running_tokens += job.input_tokens
            req = self.requests[job.index]
            self.out.ttft_s[job.index] = now - req.at_s + live.extra_ms / 1000.0
            self.out.cached[job.index] = job.cached_tokens
        # Every job of one GPU is in the GPU's pool, hence its region.
        freed: str | None = None
        for job in ev.finished:
            live = self.live.pop(job.index)
            live.pool.running_tokens -= job.input_tokens
            self._release(live, now)
            req = self.requests[job.index]
            self.out.e2e_s[job.index] = now - req.at_s + live.extra_ms / 1000.0
            self._close_ticket(job.index, Usage(req.input_tokens, req.output_tokens), False)
            self.end(job.index, Status.OK, "")
            freed = live.pool.region
            held_by = live.pool
        for job in ev.rejected:
            live = self.live.pop(job.index)
            self._release(live, now)
            self.end_unserved(job.index, Status.REFUSED, "gpu: does not fit")
            freed = live.pool.region
            held_by = live.pool
        for job in ev.expired:
            live = self.live.pop(job.index)
            self._release(live, now)
            self.end_unserved(job.index, Status.TIMED_OUT, self.timeout_reason)
            freed = live.pool.region
            held_by = live.pool
        self._push_gpu(gpu, now)
        if held_by is not None and held_by.admission is not None:
            self._send_held(held_by, now)
        if freed is not None:
            self.routing.place_waiting(freed, now)

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
        route = self.routing.arrive
        home_of, verdict = self.clients.home_of, self.clients.verdict
        home = self.out.home
        horizon = self.duration_s + self.drain_s
        if barrier > horizon:
            barrier, inclusive = horizon, True
        inf = math.inf
        i, n = self.next_arrival, len(requests)
        feed = self.feed
        if feed is not None:
            # Partitioned run with a global tier: its choices, made by worker 0, for the
            # requests entering this process's regions (fleetsim.partition).
            requests, n = (), 0
            enter = self.routing.enter_fed
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
                        enter(*feed.popleft())
                        continue
                    req = requests[i]
                    # The nearest region to the client: what "cross-region" is measured from.
                    home[i] = home_of(req)
                    self.now = t_arr
                    route(i, t_arr, verdict(req.tenant, req.country))
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
                if pool.admission is not None:
                    self._send_held(pool, now)  # a new picture; the longest waits end

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
            or self.routing.waiting()
            or any(p.admission is not None and p.admission.waiting for p in self.pools.values())
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

    def _finish_leftovers(self, next_arrival: int) -> None:
        """End what the horizon cut off: still on a GPU, still queued, never arrived."""
        self.now = self.duration_s + self.drain_s
        for index in sorted(self.live):
            self._release(self.live[index], self.duration_s + self.drain_s)
            self.end_unserved(index, Status.TIMED_OUT, "unfinished at the horizon", ran=True)
        self.live.clear()
        for pool in self.pools.values():
            if pool.admission is not None and pool.region in self.owned:
                for index, _ in pool.admission.drop_waiting():
                    self.end_unserved(index, Status.TIMED_OUT, "held by the zone at the horizon")
        self.routing.end_waiting()
        for index in range(next_arrival, len(self.requests)):
            self.end(index, Status.TIMED_OUT, "arrived after the horizon")

    def _capture_window(self, now: float) -> None:
        if self._busy_window is None:
            for gpu in self.owned_gpus:
                gpu.advance(now)
            self._busy_window = np.array([g.busy_s for g in self.gpu_list])

    def tick(self, now: float) -> None:
        """The summary tick at ``now``: faults due, the routing's summaries and views,
        GPU timeouts, queued requests placed, the utilisation timeline."""
        self.now = now
        if self._busy_window is None and now >= self.duration_s:
            self._capture_window(self.duration_s)
        self._faults_tick(now)
        self.routing.publish(now)
        for gpu in self.owned_gpus:
            if gpu.waiting or gpu.prefill:
                ev = gpu.expire(now)
                if ev.expired or ev.rejected:
                    self._gpu_events(gpu, ev, now)
            else:
                gpu.advance(now)
        for region in self.region_ids:
            self.routing.place_waiting(region, now)
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
                    self.end_unserved(job.index, Status.FAILED, "gpu crashed", ran=True)
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

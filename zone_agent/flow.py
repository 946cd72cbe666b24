"""The zone's flow control (``gtm zone --admission slo``): requests wait in the agent
while no GPU can take them without breaking the SLO of requests already there, and go,
shortest first, as room appears.

The rule is :mod:`zone_agent.costs.admission` (why, and the formula). Here are its
edges:

* :class:`TpotLedger` — per GPU, the prefill sent there (ms, cumulative) and the TPOT
  slack of each request decoding there on time, as the least *limit* (the prefill total
  at which that request's decode would miss the TPOT SLO). Sans-io; a charge per
  dispatched request, released when the request ends (:class:`Guard`, idempotent).
* :class:`Admission` — the rule over a view, the ledger and the waiting requests, without
  I/O: a request goes at once when the zone admits it and nobody waits before it; else
  it waits, and whoever may go next is asked for (:meth:`Admission.release`) whenever
  something can have made room. A request that waited ``max_wait_s`` goes anyway, where
  the profile says (the SLO is lost for it; holding it longer would only lose the
  client), and a full queue (``max_waiting``) is a 503 with ``Retry-After``. The
  simulator (fleetsim's ``gtm-admission``) runs this same class. A request that goes
  at once goes with the decision made to judge it (:class:`Plan`): one decision per
  request, not two, and the profile's choice is checked first without the arrays
  (:func:`zone_agent.costs.admission.admitted_alone`).
* :class:`FlowControl` — the agent's edge: waiting requests are futures, woken by the
  data path's events (a first byte, a request's end, a dispatch, a new view) and a timer
  for the oldest one's longest wait. While they wait on other clients' work seen in the
  last scrape (:func:`others_queued`), it asks for an early scrape of those GPUs
  (``rescrape_s``): that work may be done, and the next regular scrape far.

A request admitted on only some GPUs goes to the best of them: the first decision
excludes the others (the trace's ``admission`` step).

Counted: ``gtm_zone_admission_waiting`` (requests held now),
``gtm_zone_admission_wait_seconds`` (how long those held waited),
``gtm_zone_admission_released_total{reason}`` (``room``, ``max_wait``),
``gtm_zone_admission_refused_total`` (queue full).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, NamedTuple, Protocol, TypeVar, cast

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import Field

from gtm.clock import Clock
from gtm.errors import ConfigError, NoEligibleCandidate
from gtm.gpu_profiles import GpuProfile
from gtm.models import Frozen
from gtm.slo import TPOT_SLO_MS, TTFT_SLO_MS
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.costs import admission
from zone_agent.errors import ModelNotServed, NoCapacity
from zone_agent.metrics import LATENCY_BUCKETS
from zone_agent.plugins.fits_filter import PromptTooLong
from zone_agent.request import ZoneRequest
from zone_agent.router import ZoneDecision, ZoneProfile
from zone_agent.view import Floats, ModelIndex, ZoneView

#: Retry-After of the 503 a full queue answers, s.
FULL_RETRY_AFTER_S = 1.0


class AdmissionMode(StrEnum):
    """Whether the zone holds requests for the SLO (``gtm zone --admission``)."""

    #: Every request goes at once (the profile decides; no queue in the agent).
    OFF = "off"
    #: Requests wait while no GPU can take them within the SLO (:mod:`zone_agent.flow`).
    SLO = "slo"


class QueueOrder(StrEnum):
    """Which waiting request goes first when room appears."""

    #: The shortest prompt (most requests within the TTFT SLO per GPU second).
    SHORTEST_FIRST = "shortest-first"
    #: The oldest.
    FCFS = "fcfs"


class AdmissionSettings(Frozen):
    """The zone's flow control (``gtm zone --admission*``)."""

    mode: AdmissionMode = AdmissionMode.OFF
    #: Longest predicted queue (ms of GPU time) a request is sent into: deep enough to
    #: keep a GPU's next pass full, short enough that waiting requests keep their order.
    queue_budget_ms: float = Field(default=500.0, gt=0.0)
    #: The TPOT bound of the SLO (ms per output token, as fleetsim.metrics' goodput).
    tpot_slo_ms: float = Field(default=TPOT_SLO_MS, gt=0.0)
    #: The TTFT bound: a request predicted later than this when it is sent is off the
    #: SLO already, and its TPOT is not protected.
    ttft_slo_ms: float = Field(default=TTFT_SLO_MS, gt=0.0)
    #: Longest wait in the agent (s of wall time, what the client sees).
    max_wait_s: float = Field(default=8.0, gt=0.0)
    #: Most requests waiting at once; more are 503s with Retry-After.
    max_waiting: int = Field(default=4096, ge=1)
    order: QueueOrder = QueueOrder.SHORTEST_FIRST
    #: While requests are held and the picture holds other clients' queued work (from
    #: the last scrape), the workers where it was seen are scraped again this soon (s):
    #: that work may be done already, and waiting for the next regular scrape would hold
    #: requests for nothing (another agent or router in front of the same GPUs).
    rescrape_s: float = Field(default=0.05, gt=0.0)


class Guard:
    """One dispatched request's place in :class:`TpotLedger` (release with :meth:`close`,
    idempotent)."""

    __slots__ = ("_ledger", "gpu_id", "key", "limit_ms", "open")

    def __init__(
        self, ledger: TpotLedger, gpu_id: str, limit_ms: float, key: int | None = None
    ) -> None:
        self._ledger = ledger
        self.gpu_id = gpu_id
        #: The GPU's prefill total at which this request misses its TPOT (inf: it is
        #: not protected, being late already or one token long).
        self.limit_ms = limit_ms
        #: Its entry in the GPU's heap of limits (None: not protected).
        self.key = key
        self.open = True

    def close(self) -> None:
        if self.open:
            self.open = False
            self._ledger._closed(self)


class _Gpu:
    __slots__ = ("dead", "limits", "prefill_ms")

    def __init__(self) -> None:
        self.prefill_ms = 0.0
        #: (limit, id) of the protected requests; closed ones are dropped lazily.
        self.limits: list[tuple[float, int]] = []
        self.dead: set[int] = set()


class TpotLedger:
    """Per GPU, the prefill sent there and the TPOT limits of its decoding requests."""

    def __init__(self) -> None:
        self._gpus: dict[str, _Gpu] = {}
        self._ids = itertools.count()
        self._protected = 0

    def slack_ms(self, gpu_ids: tuple[str, ...]) -> Floats:
        """Each GPU's least slack of its protected requests (inf: none)."""
        if not self._protected:
            return np.full(len(gpu_ids), math.inf)
        return np.array([self.slack_at(gid) for gid in gpu_ids])

    def slack_at(self, gpu_id: str) -> float:
        """:meth:`slack_ms` of one GPU."""
        gpu = self._gpus.get(gpu_id)
        if gpu is None:
            return math.inf
        limits = gpu.limits
        while limits and limits[0][1] in gpu.dead:
            gpu.dead.discard(heapq.heappop(limits)[1])
        return limits[0][0] - gpu.prefill_ms if limits else math.inf

    def dispatch(self, gpu_id: str, prefill_ms: float, slack_ms: float) -> Guard:
        """A request sent to ``gpu_id``: its prefill (ms) counts against the requests
        decoding there, and, with a finite ``slack_ms``, its own decode is protected."""
        gpu = self._gpus.get(gpu_id)
        if gpu is None:
            gpu = self._gpus[gpu_id] = _Gpu()
        if prefill_ms > 0.0:
            gpu.prefill_ms += prefill_ms
        if not math.isfinite(slack_ms):
            return Guard(self, gpu_id, math.inf)
        key = next(self._ids)
        guard = Guard(self, gpu_id, gpu.prefill_ms + slack_ms, key)
        heapq.heappush(gpu.limits, (guard.limit_ms, key))
        self._protected += 1
        return guard

    def _closed(self, guard: Guard) -> None:
        if guard.key is None:
            return
        self._protected -= 1
        gpu = self._gpus[guard.gpu_id]
        gpu.dead.add(guard.key)
        if not gpu.limits or len(gpu.dead) == len(gpu.limits):
            gpu.limits.clear()
            gpu.dead.clear()

    @property
    def protected(self) -> int:
        """Requests whose TPOT is protected now (open guards with a limit)."""
        return self._protected


class FlowMetrics:
    def __init__(self, registry: CollectorRegistry, waiting: Callable[[], int]) -> None:
        self.waiting = Gauge(
            "gtm_zone_admission_waiting",
            "Requests the zone agent holds now (gtm zone --admission slo).",
            registry=registry,
        )
        self.waiting.set_function(lambda: float(waiting()))
        self.wait = Histogram(
            "gtm_zone_admission_wait_seconds",
            "How long each held request waited in the zone agent before it was sent.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.released = Counter(
            "gtm_zone_admission_released",
            "Held requests sent on, by reason: room (the zone admitted them) or max_wait "
            "(they waited the longest allowed and went anyway).",
            ["reason"],
            registry=registry,
        )
        self.refused = Counter(
            "gtm_zone_admission_refused",
            "Requests answered 503 because the zone agent's queue was full.",
            registry=registry,
        )


class _PredictsTtft(Protocol):
    """The cost model of a profile that predicts TTFT (``ttft-scorer``, which declares
    :attr:`~zone_agent.batch.ZoneCapability.COST_SCORE`)."""

    def costs_ms(self, batch: ZoneBatch, /) -> Floats: ...

    def own_costs_ms(self, batch: ZoneBatch, /) -> Floats: ...

    def own_cost_at(self, batch: ZoneBatch, position: int, uncached: float, /) -> float: ...


class ReleaseReason(StrEnum):
    """Why a held request went on."""

    #: The zone admitted it.
    ROOM = "room"
    #: It waited the longest allowed.
    MAX_WAIT = "max_wait"


W = TypeVar("W")


@dataclass(eq=False, slots=True)
class Held(Generic[W]):
    """A request waiting in :class:`Admission`; ``item`` is the caller's (a future in the
    agent, a request number in the simulator)."""

    item: W
    request: ZoneRequest
    #: When it started waiting (the caller's clock: monotonic s in the agent).
    started: float
    #: Released or given up: no longer waiting (dropped from the queues lazily).
    gone: bool = False


#: What a decision raises when it has none: the request goes on, and its decision
#: refuses it as it would without flow control.
_NO_DECISION = (ModelNotServed, PromptTooLong, NoEligibleCandidate)


class Plan(NamedTuple):
    """Flow control's word on a request that may go now: the GPUs its decision must
    exclude, and the decision itself when the one made to judge it is the one to send
    (admitted where its profile chose, with nothing excluded). Sending that decision
    rather than deciding again (the same view, profile and request: the same decision)
    halves the decisions of a request that goes at once; a request that went after a
    wait, or with GPUs excluded, is decided afresh (None)."""

    exclude: frozenset[str]
    decision: ZoneDecision | None


#: A plan that excludes nothing and leaves the decision to the sender.
GO: Plan = Plan(frozenset(), None)


class Admission(Generic[W]):
    """Flow control without I/O: the rule over a view, the TPOT ledger and the waiting
    requests, shared by the agent (:class:`FlowControl`) and the simulator (fleetsim)."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.ledger = TpotLedger()
        #: The waiting requests in the order they go: (order key, arrival, held).
        self._heap: list[tuple[float, int, Held[W]]] = []
        #: The same requests in arrival order (the order their longest wait ends in).
        self._arrivals: deque[Held[W]] = deque()
        self._seq = itertools.count()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Requests held now."""
        return self._waiting

    def plan(self, request: ZoneRequest, view: ZoneView, profile: ZoneProfile) -> Plan | None:
        """Whether ``request`` may go now (its :class:`Plan`), or None: hold it."""
        try:
            decision = profile.decide(request, view)
        except _NO_DECISION:
            return GO  # its own decision refuses it, as without flow control
        batch = decision.outcome.batch
        model = cast("_PredictsTtft | None", decision.outcome.runner.cost_model)
        if model is None:  # (check_profile refuses such profiles: start-up, policy swaps)
            return GO
        index = batch.index
        costs = model.costs_ms(batch)
        settings = self.settings
        # The profile's choice first, in scalars: admitted there whatever the other GPUs
        # (admission.admitted_alone), it goes as decided, without the arrays.
        g = decision.choice
        cost = float(costs[g])
        uncached = decision.uncached_tokens
        if admission.admitted_alone(
            cost - model.own_cost_at(batch, g, uncached),
            uncached * float(index.ms_per_token[g]),
            self.ledger.slack_at(decision.gpu_id),
            cost * float(index.ramp[g]),
            decode_step_ms(index.profiles[g], float(batch.streams[g]) + 1.0, request),
            settings.queue_budget_ms,
            settings.ttft_slo_ms,
            settings.tpot_slo_ms,
        ):
            return Plan(frozenset(), decision)
        on_time = admission.on_time_numpy(
            costs * index.ramp,  # slow start is a preference, not a slower GPU
            decode_steps_ms(index, batch.streams, request),
            settings.ttft_slo_ms,
            settings.tpot_slo_ms,
        )
        ok = admission.admitted_numpy(
            costs - model.own_costs_ms(batch),
            batch.uncached * index.ms_per_token,
            self.ledger.slack_ms(index.ids),
            on_time,
            settings.queue_budget_ms,
        )
        if ok[g]:
            return Plan(frozenset(), decision)
        if not ok.any():
            return None
        return Plan(
            frozenset(gid for gid, yes in zip(index.ids, ok.tolist(), strict=True) if not yes),
            None,
        )

    def dispatched(self, decision: ZoneDecision) -> Guard:
        """``decision`` is being sent (charged to its GPU already): charge its prefill to
        the GPU's decoders and protect its own decode while it is predicted on time."""
        request = decision.request
        index, i = decision.model_index, decision.choice
        prefill_ms = float(decision.uncached_tokens) * float(index.ms_per_token[i])
        out = request.max_output_tokens or 1
        predicted = decision.predicted_ttft_ms
        if predicted is not None:
            predicted *= float(index.ramp[i])  # slow start is a preference
        slack = math.inf  # late already, or one token long: nothing to protect
        if out > 1 and (predicted is None or predicted <= self.settings.ttft_slo_ms):
            # In flight there, this one included (the accounting the decision read).
            streams = float(decision.outcome.batch.view.accounting.streams[decision.gpu.slot])
            step_ms = decode_step_ms(index.profiles[i], streams, request)
            slack = admission.tpot_slack_ms(self.settings.tpot_slo_ms, step_ms, out)
            if slack <= 0.0:
                slack = math.inf  # that GPU cannot meet the TPOT at all
        return self.ledger.dispatch(decision.gpu_id, prefill_ms, slack)

    def hold(self, item: W, request: ZoneRequest, now: float) -> Held[W]:
        """Hold ``request`` from ``now``.

        Raises:
            NoCapacity: ``max_waiting`` are held already (the client's 503).
        """
        if self._waiting >= self.settings.max_waiting:
            raise NoCapacity(
                f"the zone agent holds {self._waiting} requests already (its queue is full)",
                retry_after_s=FULL_RETRY_AFTER_S,
            )
        held = Held(item, request, now)
        first = self.settings.order is QueueOrder.SHORTEST_FIRST
        key = float(request.input_tokens) if first else 0.0
        heapq.heappush(self._heap, (key, next(self._seq), held))
        self._arrivals.append(held)
        self._waiting += 1
        return held

    def cancel(self, held: Held[W]) -> None:
        """``held`` stops waiting without going on (its client went away)."""
        if not held.gone:
            held.gone = True
            self._waiting -= 1

    def release(
        self, now: float, view: ZoneView, profile: ZoneProfile, *, room: bool = True
    ) -> tuple[Held[W], Plan, ReleaseReason] | None:
        """The next request to send on, its plan (its decision, when sent at once, or
        the GPUs its first decision excludes), and why; or None. First whoever waited
        ``max_wait_s`` (wherever the profile says), then — with ``room`` — the queue's
        head if the zone admits it. One at a time: the caller sends it (its charge
        changes the picture) before asking again."""
        arrivals = self._arrivals
        while arrivals and arrivals[0].gone:
            arrivals.popleft()
        if arrivals and arrivals[0].started <= now - self.settings.max_wait_s:
            return self._went(arrivals.popleft(), GO, ReleaseReason.MAX_WAIT)
        heap = self._heap
        while heap and heap[0][2].gone:
            heapq.heappop(heap)
        if not room or not heap:
            return None
        held = heap[0][2]
        plan = self.plan(held.request, view, profile)
        if plan is None:
            return None
        heapq.heappop(heap)
        return self._went(held, plan, ReleaseReason.ROOM)

    def _went(
        self, held: Held[W], plan: Plan, reason: ReleaseReason
    ) -> tuple[Held[W], Plan, ReleaseReason]:
        held.gone = True
        self._waiting -= 1
        return held, plan, reason

    def drop_waiting(self) -> list[W]:
        """Stop holding everyone (the simulator's horizon): their items, oldest first."""
        items = [h.item for h in self._arrivals if not h.gone]
        for held in self._arrivals:
            held.gone = True
        self._arrivals.clear()
        self._heap.clear()
        self._waiting = 0
        return items

    def next_deadline(self) -> float | None:
        """When the oldest waiting request's longest wait ends (None: nobody waits)."""
        arrivals = self._arrivals
        while arrivals and arrivals[0].gone:
            arrivals.popleft()
        return arrivals[0].started + self.settings.max_wait_s if arrivals else None


class FlowControl:
    """The agent's flow control: :class:`Admission` over the agent's view and profile,
    its waiting requests as futures, woken by the data path's events and a timer for
    the longest wait (see the module docstring)."""

    def __init__(
        self,
        settings: AdmissionSettings,
        *,
        view: Callable[[], ZoneView],
        profile: Callable[[], ZoneProfile],
        clock: Clock,
        registry: CollectorRegistry,
        rescrape: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        check_profile(profile())
        self.settings = settings
        #: Asks for a scrape of these GPUs soon (``settings.rescrape_s``): held requests
        #: wait on other clients' work seen there in the last one (:func:`others_queued`).
        self._rescrape = rescrape
        #: The last picture :meth:`_stale` read (one answer per picture, not per poke).
        self._stale_view: ZoneView | None = None
        self.core: Admission[asyncio.Future[Plan]] = Admission(settings)
        self.ledger = self.core.ledger
        self._view = view
        self._profile = profile
        self._clock = clock
        #: Released for room and not yet dispatched: until then the picture that let
        #: them go does not show them, so nobody else goes for room.
        self._in_transit = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.metrics = FlowMetrics(registry, lambda: self.core.waiting)

    @property
    def waiting(self) -> int:
        """Requests held now."""
        return self.core.waiting

    def plan(self, facts: ZoneRequest) -> Plan | None:
        """Whether the request may go now (its :class:`Plan`), or None: hold it."""
        return self.core.plan(facts, self._view(), self._profile())

    def dispatched(self, decision: ZoneDecision) -> Guard:
        """``decision`` is being sent: :meth:`Admission.dispatched`, then the waiting
        look again (the one released for it is on its way)."""
        guard = self.core.dispatched(decision)
        self.poke()
        return guard

    async def admit(self, facts: ZoneRequest) -> Plan:
        """Wait until ``facts`` may go: its plan. Its decision comes with it only when it
        goes at once (the picture it was made on is the sender's); one that waited is
        decided afresh, excluding the plan's GPUs.

        Raises:
            NoCapacity: the queue is full (the client's 503, with Retry-After).
        """
        core = self.core
        if core.waiting == 0 and self._in_transit == 0:
            plan = self.plan(facts)
            if plan is not None:
                return plan
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Plan] = loop.create_future()
        started = self._clock.monotonic()
        try:
            held = core.hold(future, facts, started)
        except NoCapacity:
            self.metrics.refused.inc()
            raise
        self._arm(started + self.settings.max_wait_s)
        self._stale(self._view())
        try:
            return await future
        finally:
            if future.done() and not future.cancelled():
                self._in_transit -= 1
                # Its decision and dispatch run right after this, in the same step; a
                # request refused there dispatches nothing, so look again after it.
                loop.call_soon(self.poke)
            else:  # the client went away while it waited
                core.cancel(held)
                future.cancel()
            self.metrics.wait.observe(self._clock.monotonic() - started)

    def poke(self) -> None:
        """Something changed that may make room: send whoever may go now."""
        core = self.core
        if core.waiting == 0:
            return
        now, view, profile = self._clock.monotonic(), self._view(), self._profile()
        while (went := core.release(now, view, profile, room=self._in_transit == 0)) is not None:
            held, plan, reason = went
            # Its waiter resumes later, on a picture this decision was not made on.
            held.item.set_result(Plan(plan.exclude, None))
            self._in_transit += 1
            self.metrics.released.labels(reason.value).inc()
        deadline = core.next_deadline()
        if deadline is not None:
            self._arm(deadline)
            self._stale(view)

    def _stale(self, view: ZoneView) -> None:
        """Requests are held: when on other clients' work seen in the last scrape, ask
        for a fresher one of those GPUs (the work may be done; the next regular scrape
        may be far)."""
        if self._rescrape is not None and view is not self._stale_view:
            # Asked once per picture: the ask stands until the scrape, whose picture
            # replaces this one.
            self._stale_view = view
            where = others_queued(view)
            if where:
                self._rescrape(where)

    def _arm(self, at: float) -> None:
        """Poke no later than monotonic time ``at`` (the oldest waiter's last moment)."""
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        delay = max(0.0, at - self._clock.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self.poke()


def others_queued(view: ZoneView) -> frozenset[str]:
    """The GPUs of ``view`` at which the last scrape saw other clients' requests queued
    (the view's ``external_queued``: the engine's waiting requests beyond the agent's)."""
    where: set[str] = set()
    for index in view.by_model.values():
        if index.external_queued.any():
            where.update(index.ids[i] for i in np.flatnonzero(index.external_queued))
    return frozenset(where)


def decode_step_ms(profile: GpuProfile, streams: float, request: ZoneRequest) -> float:
    """``request``'s decode step on a GPU of ``profile`` with ``streams`` in flight, it
    included (ms)."""
    out = request.max_output_tokens or 1
    context = admission.decode_context_tokens(request.input_tokens, out)
    return 1000.0 * profile.decode_step_s(max(1, int(streams)), context)


def decode_steps_ms(index: ModelIndex, streams: Floats, request: ZoneRequest) -> Floats:
    """:func:`decode_step_ms` at each GPU of ``index`` were the request sent there."""
    return np.array(
        [
            decode_step_ms(profile, float(n) + 1.0, request)
            for profile, n in zip(index.profiles, streams.tolist(), strict=True)
        ]
    )


def check_profile(profile: ZoneProfile) -> None:
    """Flow control needs the profile's predicted TTFT (its cost model): ConfigError if
    the profile has none."""
    model = profile.runner.cost_model
    if model is None or ZoneCapability.COST_SCORE not in getattr(model, "capabilities", ()):
        raise ConfigError(
            f"--admission slo needs a profile that predicts TTFT (a ttft-scorer cost model); "
            f"profile {profile.name!r} has none: use --profile default or goodput"
        )

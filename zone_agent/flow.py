"""The zone's flow control (``gtm zone --admission slo``): requests wait in the agent
while no GPU can take them without breaking the SLO of requests already there, and go,
shortest first, as room appears.

The rule is :mod:`zone_agent.costs.admission` (why, and the formula). Here are its
edges:

* :class:`TpotLedger` — per GPU, the prefill sent there (ms, cumulative) and the TPOT
  slack of each request decoding there on time, as the least *limit* (the prefill total
  at which that request's decode would miss the TPOT SLO). Sans-io; a charge per
  dispatched request, released when the request ends (:class:`Guard`, idempotent).
* :class:`FlowControl` — the waiting requests (futures in a heap) and when they go: a
  request goes at once when the zone admits it and nobody waits before it; else it
  waits, and every event that can make room (a first byte, a request's end, a dispatch,
  a new view) asks the head again. A request that waited ``max_wait_s`` goes anyway,
  where the profile says (the SLO is lost for it; holding it longer would only lose the
  client), and a full queue (``max_waiting``) is a 503 with ``Retry-After``.

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
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, cast

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import Field

from gtm.clock import Clock
from gtm.errors import ConfigError, NoEligibleCandidate
from gtm.models import Frozen
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.costs import admission
from zone_agent.errors import ModelNotServed, NoCapacity
from zone_agent.metrics import LATENCY_BUCKETS
from zone_agent.plugins.fits_filter import PromptTooLong
from zone_agent.request import ZoneRequest
from zone_agent.router import ZoneDecision, ZoneProfile
from zone_agent.view import Floats, ZoneView

log = logging.getLogger(__name__)

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
    tpot_slo_ms: float = Field(default=100.0, gt=0.0)
    #: The TTFT bound: a request predicted later than this when it is sent is off the
    #: SLO already, and its TPOT is not protected.
    ttft_slo_ms: float = Field(default=2_000.0, gt=0.0)
    #: Longest wait in the agent (s of wall time, what the client sees).
    max_wait_s: float = Field(default=8.0, gt=0.0)
    #: Most requests waiting at once; more are 503s with Retry-After.
    max_waiting: int = Field(default=4096, ge=1)
    order: QueueOrder = QueueOrder.SHORTEST_FIRST


class Guard:
    """One dispatched request's place in :class:`TpotLedger` (release with :meth:`close`,
    idempotent)."""

    __slots__ = ("_ledger", "gpu_id", "limit_ms", "open")

    def __init__(self, ledger: TpotLedger, gpu_id: str, limit_ms: float) -> None:
        self._ledger = ledger
        self.gpu_id = gpu_id
        #: The GPU's prefill total at which this request misses its TPOT (inf: it is
        #: not protected, being late already or one token long).
        self.limit_ms = limit_ms
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
        self._id_of: dict[int, int] = {}

    def slack_ms(self, gpu_ids: tuple[str, ...]) -> Floats:
        """Each GPU's least slack of its protected requests (inf: none)."""
        out = np.full(len(gpu_ids), math.inf)
        for i, gid in enumerate(gpu_ids):
            gpu = self._gpus.get(gid)
            if gpu is None:
                continue
            limits = gpu.limits
            while limits and limits[0][1] in gpu.dead:
                gpu.dead.discard(heapq.heappop(limits)[1])
            if limits:
                out[i] = limits[0][0] - gpu.prefill_ms
        return out

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
        guard = Guard(self, gpu_id, gpu.prefill_ms + slack_ms)
        key = next(self._ids)
        self._id_of[id(guard)] = key
        heapq.heappush(gpu.limits, (guard.limit_ms, key))
        return guard

    def _closed(self, guard: Guard) -> None:
        key = self._id_of.pop(id(guard), None)
        if key is None:
            return
        gpu = self._gpus[guard.gpu_id]
        gpu.dead.add(key)
        if not gpu.limits or len(gpu.dead) == len(gpu.limits):
            gpu.limits.clear()
            gpu.dead.clear()

    @property
    def protected(self) -> int:
        """Requests whose TPOT is protected now (open guards with a limit)."""
        return len(self._id_of)


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

    def alone_costs_ms(self, batch: ZoneBatch, /) -> Floats: ...


@dataclass(eq=False, slots=True)
class _Waiter:
    facts: ZoneRequest
    #: Monotonic time it started waiting.
    started: float
    future: asyncio.Future[frozenset[str]]


#: What a decision raises when it has none: the request goes on, and its relay answers
#: the client as it would without flow control.
_NO_DECISION = (ModelNotServed, PromptTooLong, NoEligibleCandidate)


class FlowControl:
    """The zone's waiting requests and when they go (see the module docstring)."""

    def __init__(
        self,
        settings: AdmissionSettings,
        *,
        view: Callable[[], ZoneView],
        profile: Callable[[], ZoneProfile],
        clock: Clock,
        registry: CollectorRegistry,
    ) -> None:
        check_profile(profile())
        self.settings = settings
        self._view = view
        self._profile = profile
        self._clock = clock
        self.ledger = TpotLedger()
        #: The waiting requests in the order they go: (order key, arrival, waiter).
        self._heap: list[tuple[float, int, _Waiter]] = []
        #: The same requests in arrival order (the order their longest wait ends in).
        self._arrivals: deque[_Waiter] = deque()
        self._seq = itertools.count()
        self._waiting = 0
        #: Released for room and not yet dispatched: until then the picture that let
        #: them go does not show them, so nobody else goes.
        self._in_transit = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.metrics = FlowMetrics(registry, lambda: self._waiting)

    @property
    def waiting(self) -> int:
        """Requests held now."""
        return self._waiting

    # ------------------------------------------------------------------ the rule

    def plan(self, facts: ZoneRequest) -> frozenset[str] | None:
        """The GPUs the request must not go to now (empty: any), or None: hold it."""
        try:
            decision = self._profile().decide(facts, self._view())
        except _NO_DECISION:
            return frozenset()  # the relay's own decision refuses it, as without us
        batch = decision.outcome.batch
        model = cast("_PredictsTtft | None", decision.outcome.runner.cost_model)
        if model is None:  # check_profile refuses such profiles at start-up
            return frozenset()
        index = batch.index
        alone = model.alone_costs_ms(batch)
        queue_ms = model.costs_ms(batch) - alone
        prefill_ms = float(facts.input_tokens) * index.ms_per_token
        ok = admission.admitted_numpy(
            queue_ms, prefill_ms, self.ledger.slack_ms(index.ids), self.settings.queue_budget_ms
        )
        if ok[decision.choice]:
            return frozenset()
        if not ok.any():
            return None
        return frozenset(gid for gid, yes in zip(index.ids, ok.tolist(), strict=True) if not yes)

    def dispatched(self, decision: ZoneDecision) -> Guard:
        """``decision`` is being sent: charge its prefill to the GPU's decoders and
        protect its own decode while it is predicted on time."""
        facts = decision.request
        index, i = decision.model_index, decision.choice
        prefill_ms = float(decision.uncached_tokens) * float(index.ms_per_token[i])
        out = facts.max_output_tokens or 1
        predicted = decision.predicted_ttft_ms
        slack = math.inf  # late already, or one token long: nothing to protect
        if out > 1 and (predicted is None or predicted <= self.settings.ttft_slo_ms):
            streams = float(self._view().accounting.streams[decision.gpu.slot])
            step_ms = 1000.0 * index.profiles[i].decode_step_s(
                max(1, int(streams) + 1),
                admission.decode_context_tokens(facts.input_tokens, out),
            )
            slack = admission.tpot_slack_ms(self.settings.tpot_slo_ms, step_ms, out)
            if slack <= 0.0:
                slack = math.inf  # that GPU cannot meet the TPOT at all
        guard = self.ledger.dispatch(decision.gpu_id, prefill_ms, slack)
        self.poke()
        return guard

    # ------------------------------------------------------------------ waiting

    async def admit(self, facts: ZoneRequest) -> frozenset[str]:
        """Wait until ``facts`` may go; the GPUs its first decision must exclude.

        Raises:
            NoCapacity: the queue is full (the client's 503, with Retry-After).
        """
        if self._waiting == 0 and self._in_transit == 0:
            exclude = self.plan(facts)
            if exclude is not None:
                return exclude
        if self._waiting >= self.settings.max_waiting:
            self.metrics.refused.inc()
            raise NoCapacity(
                f"the zone agent holds {self._waiting} requests already (its queue is full)",
                retry_after_s=FULL_RETRY_AFTER_S,
            )
        loop = asyncio.get_running_loop()
        started = self._clock.monotonic()
        waiter = _Waiter(facts, started, loop.create_future())
        first = self.settings.order is QueueOrder.SHORTEST_FIRST
        key = float(facts.input_tokens) if first else 0.0
        heapq.heappush(self._heap, (key, next(self._seq), waiter))
        self._arrivals.append(waiter)
        self._waiting += 1
        self._arm(started + self.settings.max_wait_s)
        try:
            return await waiter.future
        finally:
            self._waiting -= 1
            if waiter.future.done() and not waiter.future.cancelled():
                self._in_transit -= 1
                # Its decision and dispatch run right after this, in the same step; a
                # request refused there dispatches nothing, so look again after it.
                loop.call_soon(self.poke)
            else:
                waiter.future.cancel()  # the client went away while it waited
            self.metrics.wait.observe(self._clock.monotonic() - started)

    def poke(self) -> None:
        """Something changed that may make room: send whoever may go now."""
        if not self._arrivals:
            return
        now = self._clock.monotonic()
        self._expire(now)
        heap = self._heap
        while heap and self._in_transit == 0:
            waiter = heap[0][2]
            if waiter.future.done():
                heapq.heappop(heap)
                continue
            exclude = self.plan(waiter.facts)
            if exclude is None:
                break
            heapq.heappop(heap)
            self._release(waiter, exclude, "room")
        arrivals = self._arrivals
        while arrivals and arrivals[0].future.done():
            arrivals.popleft()
        if arrivals:
            self._arm(arrivals[0].started + self.settings.max_wait_s)

    def _expire(self, now: float) -> None:
        """Send on whoever has waited the longest allowed (arrival order is the order
        their waits end in), wherever the profile says."""
        arrivals, oldest = self._arrivals, now - self.settings.max_wait_s
        while arrivals and (arrivals[0].future.done() or arrivals[0].started <= oldest):
            waiter = arrivals.popleft()
            if not waiter.future.done():
                self._release(waiter, frozenset(), "max_wait")

    def _release(self, waiter: _Waiter, exclude: frozenset[str], reason: str) -> None:
        waiter.future.set_result(exclude)
        self._in_transit += 1
        self.metrics.released.labels(reason).inc()

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


def check_profile(profile: ZoneProfile) -> None:
    """Flow control needs the profile's predicted TTFT (its cost model): ConfigError if
    the profile has none."""
    model = profile.runner.cost_model
    if model is None or ZoneCapability.COST_SCORE not in getattr(model, "capabilities", ()):
        raise ConfigError(
            f"--admission slo needs a profile that predicts TTFT (a ttft-scorer cost model); "
            f"profile {profile.name!r} has none: use --profile default or goodput"
        )

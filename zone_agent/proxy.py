"""The zone's data path: what the zone plugs into the core relay (:mod:`gtm.relay`).

One request (the handler is :class:`zone_agent.api.OpenAiApi`): decide
(:class:`~zone_agent.router.ZoneProfile`), charge the GPU
(:class:`~zone_agent.accounting.Ticket`), send it over the zone's own keep-alive pool
(:class:`~zone_agent.upstream.UpstreamPool`), relay the response. The relay owns the
retry-before-first-byte loop, streaming, telling the client of a break after the first
byte (and counting it) and the hop-by-hop headers; the zone's
hooks (:class:`ZoneRelay`) add:

* **Targets**: each attempt is a fresh decision that excludes the GPUs tried; no GPU
  left is the client's 503 on the first attempt, and the end of the retries after it.
* **First-byte deadline** (streaming requests): a GPU that accepts a request and then
  says nothing (black-holed, wedged) would hold it for the whole upstream timeout. A
  streamed response's first chunk comes after the prefill, so it must arrive within
  ``first_byte_ttft_factor`` × the decision's predicted TTFT, and never sooner than
  ``first_byte_floor_s``; past that the attempt counts as a timeout (passive health) and
  the request is retried on another GPU — nothing has reached the client yet.
  Non-streamed responses send nothing until they are done, so only the upstream
  timeout applies to them.
* **Passive health**: connect failures, timeouts, resets and 5xx count towards ejection
  (a 429 is load, not ill health); a completed response counts as a success. A client
  going away blames nobody.
* **Headers**: ``x-request-id`` (the client's, or a new one) goes upstream and back;
  responses carry ``x-gtm-zone``, ``x-gtm-gpu`` and ``x-gtm-decision-id``.
* **Credentials**: a client's (:data:`gtm.credentials.CLIENT_CREDENTIALS`) never goes
  upstream; each worker gets its own key (:mod:`zone_agent.credentials`, looked up per
  attempt). A worker that answers 401 refused that key: the attempt moves on to another
  GPU, and a request every GPU refused is a 502 saying so, not the worker's 401 (the
  client's key was fine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict

from gtm import headers as gtm_headers
from gtm import tracing
from gtm.clock import Clock
from gtm.credentials import CLIENT_CREDENTIALS
from gtm.errors import AttemptFailed, NoEligibleCandidate, UpstreamError
from gtm.inbound import Scope
from gtm.relay import (
    Downstream,
    Ending,
    Failure,
    RelayLoop,
    Upstream,
    describe,
    end_to_end,
    skip_set,
)
from zone_agent.accounting import Accounting, Ticket
from zone_agent.affinity import keeps_affinity, sticky_gpu
from zone_agent.errors import (
    ApiError,
    BadRequest,
    ErrorType,
    ModelNotFound,
    ModelNotServed,
    NoCapacity,
)
from zone_agent.flow import FlowControl, Guard
from zone_agent.health import HealthTracker, Outcome
from zone_agent.metrics import ZoneMetrics
from zone_agent.plugins.fits_filter import PromptTooLong
from zone_agent.request import (
    HEADER_DECISION,
    HEADER_GPU,
    HEADER_REQUEST_ID,
    HEADER_ZONE,
    ZoneRequest,
)
from zone_agent.router import ZoneDecision, ZoneProfile
from zone_agent.upstream import UpstreamConnectError, UpstreamPool
from zone_agent.view import ZoneView

log = logging.getLogger(__name__)

#: Retry-After of a 503 when no GPU can take a request: about when health checks and
#: ejection timers next change the picture (seconds).
NO_CAPACITY_RETRY_AFTER_S = 1.0

#: Client headers not sent upstream: hop-by-hop ones, the request id (set anew), the
#: tiers' own assertions (a worker needs none; a tier's signature stays inside) and a
#: client's credentials (a worker gets its own key instead).
_SKIP_UPSTREAM = skip_set(HEADER_REQUEST_ID, *gtm_headers.TIER_ONLY, *CLIENT_CREDENTIALS)
#: What a worker answers when it refuses the zone's key for it (vLLM's ``--api-key``).
_KEY_REFUSED = 401


def _no_key(worker_id: str) -> tuple[str, str] | None:
    return None


#: How a failed attempt reflects on the GPU (None: not at all).
_FAILURE_OUTCOME = {
    Failure.CONNECT: Outcome.CONNECT,
    Failure.TIMEOUT: Outcome.TIMEOUT,
    Failure.RESET: Outcome.RESET,
}
_ENDING_OUTCOME = {
    Ending.COMPLETED: Outcome.SUCCESS,
    Ending.CUT_TIMEOUT: Outcome.TIMEOUT,
    Ending.CUT_RESET: Outcome.RESET,
    # The answer was whole, but the worker broke its connection before the body's end.
    Ending.CUT_AFTER_DONE: Outcome.RESET,
}


@dataclass(frozen=True, slots=True)
class ProxySettings:
    zone_id: str
    max_attempts: int = 3
    trace_top: int = 16
    #: Shortest first-byte deadline of a streamed response, s: above the TTFT of a long
    #: prompt on a busy GPU, below what an interactive client waits (the chaos anchor's
    #: black-holed-GPU scenario bounds the stall at ~10 s including one retry).
    first_byte_floor_s: float = 5.0
    #: The deadline in multiples of the predicted TTFT (the prediction is a queueing
    #: estimate: 4× leaves room for its error before a GPU is called silent).
    first_byte_ttft_factor: float = 4.0
    #: Longest first-byte deadline, s (the upstream read timeout).
    first_byte_cap_s: float = 300.0
    #: Apply the agent's stickiness rule (:func:`zone_agent.affinity.sticky_gpu`) to
    #: gtm's own profiles (ZoneConfig.affinity).
    affinity: bool = True

    def first_byte_timeout(self, facts: ZoneRequest, decision: ZoneDecision) -> float | None:
        """Seconds the GPU has to send the first chunk, or ``None`` (no deadline)."""
        if not facts.stream:
            return None
        predicted_s = (decision.predicted_ttft_ms or 0.0) / 1000.0
        return min(
            self.first_byte_cap_s,
            max(self.first_byte_floor_s, self.first_byte_ttft_factor * predicted_s),
        )


def decide_or_refuse(
    profile: ZoneProfile,
    facts: ZoneRequest,
    view: ZoneView,
    tried: frozenset[str],
    *,
    affinity: bool = True,
    not_admitted: frozenset[str] = frozenset(),
    decided: ZoneDecision | None = None,
) -> ZoneDecision:
    """A decision, or the ApiError the client gets when there is none (``affinity``:
    whether the stickiness rule may apply, :func:`keeps_affinity`; ``not_admitted``: GPUs
    the zone's flow control keeps the request from, :mod:`zone_agent.flow`; ``decided``:
    the profile's decision made already, on this view, by flow control's plan)."""
    if decided is not None:
        decision = decided
    else:
        try:
            decision = profile.decide(facts, view, exclude=tried, not_admitted=not_admitted)
        except _REFUSALS as exc:
            raise refusal(exc, facts, view) from None
    # Back to the GPU the prompt's prefix was just sent to, while it can take it.
    return sticky_gpu(decision) if affinity and keeps_affinity(profile) else decision


#: What :meth:`ZoneProfile.decide` raises when it has no decision (:func:`refusal`).
_REFUSALS = (ModelNotServed, PromptTooLong, NoEligibleCandidate)


def refusal(
    exc: ModelNotServed | PromptTooLong | NoEligibleCandidate, facts: ZoneRequest, view: ZoneView
) -> Exception:
    """The error the client gets for a decision's refusal (one of :data:`_REFUSALS`)."""
    if isinstance(exc, ModelNotServed):
        return ModelNotFound(facts.model)
    if isinstance(exc, PromptTooLong):
        return BadRequest(str(exc.reason), param="messages", code="context_length_exceeded")
    return NoCapacity(
        f"no GPU in zone {view.zone_id!r} can take this request now ({exc})",
        retry_after_s=NO_CAPACITY_RETRY_AFTER_S,
    )


def charge(accounting: Accounting, decision: ZoneDecision) -> Ticket:
    """Charge a decided request to its GPU (pending tokens, streams, KV, prefix blocks)."""
    facts, index, i = decision.request, decision.model_index, decision.choice
    block = float(index.block_size[i])
    kv = -(-facts.input_tokens // max(1, int(block))) + facts.prompts
    return accounting.start(
        decision.gpu_id,
        prefill_tokens=decision.uncached_tokens,
        sequences=facts.sequences,
        kv_blocks=float(kv),
        prefix_hashes=facts.prefix_hashes,
        prefix_capacity=int(index.prefix_capacity[i]),
    )


class DataPath:
    """What every request of a zone agent shares: settings, view, profile, pools."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        view: Callable[[], ZoneView],
        profile: Callable[[], ZoneProfile],
        accounting: Accounting,
        health: HealthTracker,
        on_ejection: Callable[[str], None],
        session: Callable[[], UpstreamPool | None],
        metrics: ZoneMetrics,
        clock: Clock,
        new_id: Callable[[], str],
        worker_auth: Callable[[str], tuple[str, str] | None] = _no_key,
        on_sent: Callable[[bytes, ZoneRequest, int], None] | None = None,
        flow: FlowControl | None = None,
    ) -> None:
        self.settings = settings
        self.view = view
        self.profile = profile
        self.accounting = accounting
        self.health = health
        self.on_ejection = on_ejection
        self.session = session
        self.metrics = metrics
        self.clock = clock
        self.new_id = new_id
        #: The worker's ``Authorization`` header by GPU id (None: no key).
        self.worker_auth = worker_auth
        #: GPUs whose refusal of the zone's key was logged (once per GPU and process).
        self._refused: set[str] = set()
        #: Told of each body sent, with its facts and the GPU's block size (the KV-event
        #: source maps the prompt's token blocks: zone_agent.kv_events).
        self.on_sent = on_sent
        #: The zone's flow control (``--admission slo``): requests wait in it while no
        #: GPU can take them within the SLO. None: every request goes at once.
        self.flow = flow
        # Per-request lookups cached: a labelled child costs a lock and a tuple per
        # ``.labels()`` call. Bounded by the GPUs (× profiles) the zone has had.
        self._assigned: dict[tuple[str, str], Callable[[], None]] = {}

    def count_assignment(self, decision: ZoneDecision) -> None:
        key = (decision.gpu_id, decision.profile)
        inc = self._assigned.get(key)
        if inc is None:
            inc = self._assigned[key] = self.metrics.assignments.labels(*key).inc
        inc()

    def key_refused(self, gpu_id: str) -> None:
        """A worker answered 401: it refused the key sent (or wants one); logged once."""
        if gpu_id not in self._refused:
            self._refused.add(gpu_id)
            log.warning(
                "GPU %s refused the zone's worker API key (HTTP 401): check its key "
                "(gtm zone --worker-api-key-*) against the worker's --api-key",
                gpu_id,
            )

    def record(self, gpu_id: str, outcome: Outcome) -> None:
        """A GPU's passive-health observation (may eject it)."""
        now = self.clock.monotonic()
        if outcome is not Outcome.SUCCESS:
            self.metrics.upstream_failures.labels(gpu_id, outcome.value).inc()
        if self.health.record(gpu_id, outcome, now):
            log.warning("ejected GPU %s after consecutive failures (%s)", gpu_id, outcome)
            self.metrics.ejections.labels(gpu_id).inc()
            self.on_ejection(gpu_id)


class ZoneRelay(RelayLoop[ZoneDecision]):
    """One request's attempts on the zone's GPUs (the hooks of :class:`gtm.relay.RelayLoop`),
    answered through ``client``: aiohttp's server or the lean one (:mod:`gtm.http1`)."""

    def __init__(
        self,
        request: Scope,
        client: Downstream,
        path: DataPath,
        raw: bytes,
        facts: ZoneRequest,
        started: float,
    ) -> None:
        super().__init__(
            request,
            client,
            max_attempts=path.settings.max_attempts,
            breaks=path.metrics.stream_breaks,
        )
        self._path = path
        self._raw = raw
        self._facts = facts
        self._started = started
        self._ticket: Ticket | None = None
        self._guard: Guard | None = None
        #: GPUs flow control keeps the first attempt from (zone_agent.flow).
        self._not_admitted: frozenset[str] = frozenset()
        #: The decision flow control made to admit the request, sent as the first
        #: attempt's (None: the first attempt decides).
        self._planned: ZoneDecision | None = None
        self._held_s = 0.0
        #: Whether the request has a span (asked once: the server opens it before the
        #: handler runs), so an untraced request skips tracing's calls per attempt.
        self._traced = tracing.traced(request)

    def run(self) -> Coroutine[Any, Any, None]:
        # Not a coroutine itself: without flow control the relay's own is the request's
        # (no frame more per request).
        if self._path.flow is None:
            return super().run()
        return self._admitted()

    async def _admitted(self) -> None:
        """Wait for flow control's word, then relay (``--admission slo``)."""
        flow = self._path.flow
        assert flow is not None
        waited = time.perf_counter()
        plan = await flow.admit(self._facts)
        self._not_admitted = plan.exclude
        if plan.decision is None:
            # Held (or to be decided afresh): the overhead metric is the agent's own
            # time, not the time held.
            self._held_s = time.perf_counter() - waited
        elif not self._path.accounting.holds:  # (expiring holds changes the picture)
            # Sent at once with the plan's decision: the time in flow control was the
            # decision's (and the admission check's), the agent's own.
            self._planned = plan.decision
        await super().run()

    def next_target(self, tried: frozenset[str]) -> ZoneDecision | None:
        path = self._path
        acc = path.accounting
        if acc.holds:  # tickets /v1/assign holds; none: no clock to read, nothing to expire
            acc.expire(path.clock.monotonic())
        planned, self._planned = self._planned, None
        try:
            decision = decide_or_refuse(
                path.profile(),
                self._facts,
                path.view(),
                tried,
                affinity=path.settings.affinity,
                not_admitted=self._not_admitted if not tried else frozenset(),
                decided=planned,
            )
        except NoCapacity:
            if not tried:
                raise
            return None  # retries end here; the failures so far are the answer
        path.count_assignment(decision)
        path.metrics.decision.observe(time.perf_counter() - self._started - self._held_s)
        if self._traced:
            tracing.decided(
                self.scope,
                profile=decision.profile,
                predicted_ttft_ms=decision.predicted_ttft_ms,
                matched_blocks=decision.matched_blocks,
            )
        return decision

    def target_id(self, target: ZoneDecision) -> str:
        return target.gpu_id

    def begin(self, target: ZoneDecision) -> Callable[[], None]:
        path = self._path
        ticket = self._ticket = charge(path.accounting, target)
        on_sent = path.on_sent
        if on_sent is not None:
            on_sent(self._raw, self._facts, int(target.model_index.block_size[target.choice]))
        flow = path.flow
        if flow is None:
            return ticket.close
        self._guard = flow.dispatched(target)
        return self._release_held

    def _release_held(self) -> None:
        """The attempt ended (flow control on): release its charges, then let the
        waiting requests look again."""
        if self._ticket is not None:
            self._ticket.close()
        if self._guard is not None:
            self._guard.close()
        flow = self._path.flow
        if flow is not None:
            flow.poke()

    def first_byte_deadline(self, target: ZoneDecision) -> float | None:
        limit = self._path.settings.first_byte_timeout(self._facts, target)
        return None if limit is None else asyncio.get_running_loop().time() + limit

    def open(self, target: ZoneDecision) -> Awaitable[Upstream]:
        # Not a coroutine: the relay awaits the pool's own (a connect failure is
        # translated by open_failed).
        headers = end_to_end(self.scope.headers, _SKIP_UPSTREAM)
        headers.append((HEADER_REQUEST_ID, self._facts.request_id))
        auth = self._path.worker_auth(target.gpu_id)
        if auth is not None:
            headers.append(auth)
        if self._traced:
            tracing.inject(self.scope, headers)  # the worker's parent is this hop's span
        pool = self._path.session()
        if pool is None:
            raise RuntimeError("the zone agent is not started")
        return pool.post(target.gpu.worker.url, self.scope.path, headers, self._raw)

    def open_failed(self, error: UpstreamError | OSError) -> AttemptFailed:
        if isinstance(error, UpstreamConnectError):
            return AttemptFailed(Failure.CONNECT, f"connect failed: {error.os_error}")
        return super().open_failed(error)

    def retry_status(self, status: int) -> bool:
        return status >= 500 or status == 429 or status == _KEY_REFUSED

    def first_byte(self, target: ZoneDecision) -> None:
        if self._ticket is not None:
            self._ticket.prefill_done()
            flow = self._path.flow
            if flow is not None:
                flow.poke()  # its queue part is done: room for the next prompt
        elapsed = time.perf_counter() - self._started
        self._path.metrics.observe_first_byte(self._facts.model, elapsed)

    def response_headers(self, target: ZoneDecision, headers: CIMultiDict[str]) -> None:
        headers[HEADER_ZONE] = self._path.settings.zone_id
        headers[HEADER_GPU] = target.gpu_id
        headers[HEADER_DECISION] = self._path.new_id()
        headers[HEADER_REQUEST_ID] = target.request.request_id

    def failed(self, target: ZoneDecision, failure: AttemptFailed) -> None:
        path = self._path
        path.metrics.retries.labels(failure.reason).inc()
        if failure.kind == Failure.STATUS:
            # A full queue (429) is load, not ill health: no outlier mark; nor is a
            # refused key (401), which the operator must fix (logged).
            status = failure.status or 0
            if status == _KEY_REFUSED:
                path.key_refused(target.gpu_id)
            outcome: Outcome | None = Outcome.ERROR_5XX if status >= 500 else None
        else:
            outcome = _FAILURE_OUTCOME.get(Failure(failure.kind))
        if outcome is not None:
            path.record(target.gpu_id, outcome)

    def finished(self, target: ZoneDecision, ending: Ending) -> None:
        outcome = _ENDING_OUTCOME.get(ending)
        if outcome is not None:
            self._path.record(target.gpu_id, outcome)

    def exhausted(self) -> Exception:
        failures = self.failures
        detail = describe(failures) or "no attempt was made"
        if any(f.status == _KEY_REFUSED for f in failures):
            # First, so that it survives the tiers above cutting the message short.
            detail = f"a worker refused the zone's worker API key (HTTP 401): {detail}"
        if failures and failures[-1].status == 429:
            return ApiError(
                429,
                f"every GPU tried is at capacity ({detail})",
                type=ErrorType.UNAVAILABLE,
                code="rate_limit_exceeded",
                retry_after_s=NO_CAPACITY_RETRY_AFTER_S,
            )
        return ApiError(
            502,
            f"the request failed on {len(failures)} GPU(s) before any response: {detail}",
            type=ErrorType.SERVER,
            code="upstream_failed",
        )

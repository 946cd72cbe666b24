"""The data path: an aiohttp reverse proxy for the OpenAI API, one GPU decision per request.

For each request: parse and count it (:mod:`zone_agent.request`), decide
(:class:`~zone_agent.pipeline.ZoneProfile`), charge the GPU (:class:`~zone_agent.
accounting.Ticket`), send it upstream over a keep-alive pool
(:class:`~zone_agent.upstream.UpstreamPool`), and relay the response.

* **Streaming**: the body is relayed chunk by chunk as it arrives, never buffered or
  decompressed, so the bytes are the worker's own.
* **Retries** happen only before the first byte reaches the client, on a GPU not tried
  yet, at most ``max_attempts`` (3) in all: on a connect failure, a timeout or reset
  before the response headers, a 5xx, or a 429 (that worker's queue is full). Once the
  client has the status line, a failure cuts the client's connection (an SSE client sees
  no ``[DONE]``), as ARCHITECTURE §6 requires.
* **Cancellation**: when the client goes away aiohttp cancels the handler; the upstream
  response is closed (the worker sees the disconnect and aborts the request) and the
  ticket released. Every path closes the ticket in a ``finally``.
* **First-byte deadline** (streaming requests): a GPU that accepts a request and then
  says nothing (black-holed, wedged) would hold it for the whole upstream timeout. A
  streamed response's first chunk comes after the prefill, so it must arrive within
  ``first_byte_ttft_factor`` × the decision's predicted TTFT, and never sooner than
  ``first_byte_floor_s``; past that the attempt counts as a timeout (passive health) and
  the request is retried on another GPU — nothing has reached the client yet.
  Non-streamed responses send nothing until they are done, so only the upstream
  timeout applies to them.
* **Passive health**: connect failures, timeouts, resets and 5xx count towards ejection;
  a completed response counts as a success. A client going away blames nobody.
* **Headers**: ``x-request-id`` (the client's, or a new one) goes upstream and back;
  responses carry ``x-gtm-zone``, ``x-gtm-gpu`` and ``x-gtm-decision-id``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from gtm.clock import Clock
from gtm.errors import NoEligibleCandidate
from gtm.openai_request import parse_json_body
from zone_agent.accounting import Accounting, Ticket
from zone_agent.errors import ApiError, BadRequest, ErrorType, ModelNotFound, NoCapacity
from zone_agent.health import HealthTracker, Outcome
from zone_agent.metrics import ZoneMetrics
from zone_agent.pipeline import ModelNotServed, ZoneDecision, ZoneProfile
from zone_agent.plugins.fits import PromptTooLong
from zone_agent.request import CanaryChoice, Endpoint, ZoneRequest, zone_request
from zone_agent.upstream import UpstreamConnectError, UpstreamError, UpstreamPool, UpstreamResponse
from zone_agent.view import ZoneView

log = logging.getLogger(__name__)

#: Hop-by-hop headers (RFC 9110 §7.6.1) and those the proxy recomputes.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

#: Bytes of an upstream error body kept for the client's error message.
_ERROR_BODY_BYTES = 4096

#: Retry-After of a 503 when no GPU can take a request: about when health checks and
#: ejection timers next change the picture (seconds).
NO_CAPACITY_RETRY_AFTER_S = 1.0

HEADER_ZONE = "x-gtm-zone"
HEADER_GPU = "x-gtm-gpu"
HEADER_DECISION = "x-gtm-decision-id"
HEADER_REQUEST_ID = "x-request-id"
HEADER_VERSION = "x-gtm-version"
HEADER_CANARY = "x-gtm-canary"


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

    def first_byte_timeout(self, facts: ZoneRequest, decision: ZoneDecision) -> float | None:
        """Seconds the GPU has to send the first chunk, or ``None`` (no deadline)."""
        if not facts.stream:
            return None
        predicted_s = (decision.predicted_ttft_ms or 0.0) / 1000.0
        return min(
            self.first_byte_cap_s,
            max(self.first_byte_floor_s, self.first_byte_ttft_factor * predicted_s),
        )


class _Retry(Exception):
    """An attempt failed before the first byte; try another GPU."""

    def __init__(
        self,
        reason: str,
        detail: str,
        status: int | None = None,
        body: bytes = b"",
        outcome: Outcome | None = None,
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status
        self.body = body
        #: What it says about the GPU's health (None: nothing).
        self.outcome = outcome


class Ids:
    """Unique ids for requests and decisions: a random 64-bit prefix per process and a
    counter (32 hex digits, as ``uuid4().hex``). ``uuid4`` costs a ``getrandom`` system
    call and an object per id, twice per proxied request."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16]
        self._next = itertools.count(1).__next__

    def new(self) -> str:
        return f"{self._prefix}{self._next():016x}"


_IDS = Ids()


def request_id_of(request: web.Request, ids: Ids = _IDS) -> str:
    rid = request.headers.get(HEADER_REQUEST_ID, "")
    if rid and len(rid) <= 128 and rid.isprintable():
        return rid
    return ids.new()


def canary_of(request: web.Request) -> CanaryChoice:
    raw = request.headers.get(HEADER_CANARY)
    if raw is None:
        return CanaryChoice.AUTO
    raw = raw.strip().lower()
    try:
        return CanaryChoice(raw)
    except ValueError:
        raise BadRequest(
            f"{HEADER_CANARY} must be one of {', '.join(c.value for c in CanaryChoice)}",
            param=HEADER_CANARY,
        ) from None


async def read_request(
    request: web.Request, endpoint: Endpoint, accounting: Accounting
) -> tuple[bytes, ZoneRequest]:
    """The raw body and the decision facts; ApiError (400) when the body is bad."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(
            413, f"the request body is too large: {exc.text}", code="body_too_large"
        ) from None
    body = parse_json_body(raw)
    version = request.headers.get(HEADER_VERSION) or None
    facts = zone_request(
        body,
        endpoint,
        request_id=request_id_of(request),
        seq=accounting.next_seq(),
        version=version,
        canary=canary_of(request),
    )
    return raw, facts


def decide_or_refuse(
    profile: ZoneProfile, facts: ZoneRequest, view: ZoneView, tried: frozenset[str]
) -> ZoneDecision:
    """A decision, or the ApiError the client gets when there is none."""
    try:
        return profile.decide(facts, view, exclude=tried)
    except ModelNotServed:
        raise ModelNotFound(facts.model) from None
    except PromptTooLong as exc:
        raise BadRequest(
            str(exc.reason), param="messages", code="context_length_exceeded"
        ) from None
    except NoEligibleCandidate as exc:
        raise NoCapacity(
            f"no GPU in zone {view.zone_id!r} can take this request now ({exc})",
            retry_after_s=NO_CAPACITY_RETRY_AFTER_S,
        ) from None


def upstream_headers(request: web.Request, request_id: str) -> list[tuple[str, str]]:
    """The client's end-to-end headers, with ``x-request-id`` set to ``request_id``."""
    headers = [
        (k, v)
        for k, v in request.headers.items()
        if (low := k.lower()) not in _HOP_BY_HOP and low != HEADER_REQUEST_ID
    ]
    headers.append((HEADER_REQUEST_ID, request_id))
    return headers


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


class Proxy:
    """The OpenAI endpoints of a zone agent."""

    def __init__(
        self,
        settings: ProxySettings,
        *,
        view: Callable[[], ZoneView],
        profile: Callable[[], ZoneProfile],
        accounting: Accounting,
        health: HealthTracker,
        on_ejection: Callable[[str], None],
        session: Callable[[], UpstreamPool],
        metrics: ZoneMetrics,
        clock: Clock,
    ) -> None:
        self._settings = settings
        self._view = view
        self._profile = profile
        self._acc = accounting
        self._health = health
        self._on_ejection = on_ejection
        self._session = session
        self._metrics = metrics
        self._clock = clock
        self._ids = Ids()
        # Per-request lookups cached: a labelled child costs a lock and a tuple per
        # ``.labels()`` call. Bounded by the GPUs (× profiles) the zone has had.
        self._assigned: dict[tuple[str, str], Callable[[], None]] = {}

    def _count_assignment(self, decision: ZoneDecision) -> None:
        key = (decision.gpu_id, decision.profile)
        inc = self._assigned.get(key)
        if inc is None:
            inc = self._assigned[key] = self._metrics.assignments.labels(*key).inc
        inc()

    def routes(self, app: web.Application) -> None:
        for endpoint in Endpoint:
            app.router.add_post(endpoint.path, self._handler(endpoint))

    def _handler(
        self, endpoint: Endpoint
    ) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.handle(request, endpoint)

        return handle

    def _record(self, gpu_id: str, outcome: Outcome) -> None:
        now = self._clock.monotonic()
        if outcome is not Outcome.SUCCESS:
            self._metrics.upstream_failures.labels(gpu_id, outcome.value).inc()
        if self._health.record(gpu_id, outcome, now):
            log.warning("ejected GPU %s after consecutive failures (%s)", gpu_id, outcome)
            self._metrics.ejections.labels(gpu_id).inc()
            self._on_ejection(gpu_id)

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        started = time.perf_counter()
        raw, facts = await read_request(request, endpoint, self._acc)
        tried: set[str] = set()
        failures: list[str] = []
        last: _Retry | None = None
        for _attempt in range(self._settings.max_attempts):
            self._acc.expire(self._clock.monotonic())
            try:
                decision = decide_or_refuse(self._profile(), facts, self._view(), frozenset(tried))
            except NoCapacity:
                if last is None:
                    raise
                break
            self._count_assignment(decision)
            self._metrics.decision.observe(time.perf_counter() - started)
            try:
                return await self._attempt(request, raw, facts, decision, started)
            except _Retry as retry:
                tried.add(decision.gpu_id)
                failures.append(f"{decision.gpu_id}: {retry.detail}")
                self._metrics.retries.labels(retry.reason).inc()
                last = retry
        raise _exhausted(failures, last)

    async def _attempt(
        self,
        request: web.Request,
        raw: bytes,
        facts: ZoneRequest,
        decision: ZoneDecision,
        started: float,
    ) -> web.StreamResponse:
        gpu_id = decision.gpu_id
        ticket = charge(self._acc, decision)
        upstream: UpstreamResponse | None = None
        outcome: Outcome | None = None
        completed = False
        limit = self._settings.first_byte_timeout(facts, decision)
        deadline = None if limit is None else asyncio.get_running_loop().time() + limit
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    upstream = await self._session().post(
                        decision.gpu.worker.url,
                        request.path,
                        upstream_headers(request, facts.request_id),
                        raw,
                    )
            except UpstreamConnectError as exc:
                outcome = Outcome.CONNECT
                raise _Retry("connect", f"connect failed: {exc.os_error}") from None
            except TimeoutError:
                outcome = Outcome.TIMEOUT
                raise _Retry("timeout", "no response headers in time") from None
            except (UpstreamError, OSError) as exc:
                outcome = Outcome.RESET
                raise _Retry("reset", f"failed before the response: {exc!r}") from None
            if upstream.status >= 500 or upstream.status == 429:
                body = await _bounded_body(upstream)
                # A full queue (429) is load, not ill health: no outlier mark.
                outcome = Outcome.ERROR_5XX if upstream.status >= 500 else None
                raise _Retry(
                    f"http_{upstream.status}", f"HTTP {upstream.status}", upstream.status, body
                )
            try:
                response, outcome, completed = await self._relay(
                    request, upstream, ticket, decision, started, deadline
                )
            except _Retry as retry:
                outcome = retry.outcome
                raise
            return response
        finally:
            if upstream is not None:
                if completed:
                    upstream.release()  # fully read: the connection goes back to the pool
                else:
                    upstream.close()  # the worker sees the disconnect and aborts
            ticket.close()
            if outcome is not None:
                self._record(gpu_id, outcome)

    async def _relay(
        self,
        request: web.Request,
        upstream: UpstreamResponse,
        ticket: Ticket,
        decision: ZoneDecision,
        started: float,
        deadline: float | None = None,
    ) -> tuple[web.StreamResponse, Outcome | None, bool]:
        """Relay the response; (response, outcome for health, upstream fully read).

        The first chunk is read *before* the client gets the status line, so a worker
        that fails between its headers and its first token is still retried elsewhere.
        """
        try:
            async with asyncio.timeout_at(deadline):
                first = await upstream.readany()
        except TimeoutError:
            raise _Retry("timeout", "no first byte in time", outcome=Outcome.TIMEOUT) from None
        except (UpstreamError, OSError) as exc:
            raise _Retry(
                "reset", f"failed before the first byte: {exc!r}", outcome=Outcome.RESET
            ) from None
        ticket.prefill_done()
        self._metrics.first_byte.observe(time.perf_counter() - started)
        headers = response_headers(upstream.headers)
        headers[HEADER_ZONE] = self._settings.zone_id
        headers[HEADER_GPU] = decision.gpu_id
        headers[HEADER_DECISION] = self._ids.new()
        headers[HEADER_REQUEST_ID] = decision.request.request_id
        if upstream.content_length is not None and len(first) == upstream.content_length:
            # The whole (non-streamed) body came in one read: answer it as one response,
            # so headers and body leave in a single write instead of two.
            whole = web.Response(
                status=upstream.status, reason=upstream.reason, headers=headers, body=first
            )
            return whole, Outcome.SUCCESS, True
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=headers
        )
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        await response.prepare(request)
        try:
            chunk = first
            while chunk:
                await response.write(chunk)
                try:
                    chunk = await upstream.readany()
                except TimeoutError:
                    return _cut(request, response), Outcome.TIMEOUT, False
                except (UpstreamError, OSError):
                    return _cut(request, response), Outcome.RESET, False
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return response, None, False  # the client went away: nobody's fault upstream
        return response, Outcome.SUCCESS, True


def _cut(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """The worker failed mid-response: reset the client's connection (no clean end)."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    return response


async def _bounded_body(response: UpstreamResponse) -> bytes:
    try:
        return await asyncio.wait_for(response.read(_ERROR_BODY_BYTES), 5.0)
    except (TimeoutError, UpstreamError, OSError):
        return b""


def _exhausted(failures: list[str], last: _Retry | None) -> ApiError:
    detail = "; ".join(failures) or "no attempt was made"
    if last is not None and last.status == 429:
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


def response_headers(upstream: Mapping[str, str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in _HOP_BY_HOP)

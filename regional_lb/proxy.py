"""The regional data path: what the regional LB plugs into the core relay (:mod:`gtm.relay`).

Two ways out of a region, each a :class:`gtm.relay.Relay`:

* :class:`LocalRelay` — to a zone agent of this region. The first attempt goes to the
  decision's zone (already charged when it came from the fair queue); each retry asks
  the router again with the zones tried excluded. Every attempt is charged to its zone
  and released when it ends, and a release dispatches the fair queue (room appeared).
* :class:`PeerRelay` — spillover to a peer region's regional LB, only to the decision's
  peer and fallbacks inside the residency-allowed set, each audited before the bytes
  leave, with the hop count and the spill chain (``x-gtm-spilled-from``) raised, the
  client's location asserted, and every attempt signed for the peer (:mod:`gtm.trust`).

Neither way passes on a tier-only ``x-gtm-`` header it received
(:func:`gtm.headers.is_tier_only`): a zone needs none, and a peer gets only what this
tier asserts and signs itself. The client's credentials
(:data:`gtm.credentials.CLIENT_CREDENTIALS`) stop here on the way to a zone: the
tenant is authenticated, and a zone (and its workers) needs no tenant key; a peer
region authenticates the tenant again, so it gets the key.

The relay retries before the first byte only (a connect failure, a timeout or reset, a
5xx, or a 429: that zone's queue is full), at most ``max_attempts`` (3, ARCHITECTURE §6),
streams without buffering (``auto_decompress`` off: the bytes are the upstream's own)
and tells the client when the upstream fails after the first byte (:mod:`gtm.relay`: an
SSE client's error event, else a reset; ``gtm_stream_breaks_total``). When every attempt
failed: 503 + Retry-After if every target was at capacity, else 502.

**Usage**: :class:`~gtm.usage.UsageTap` watches the relayed bytes for the OpenAI
``usage`` object (a JSON body, or the last SSE chunk when the client asked for it) and
otherwise counts streamed content chunks, so quotas and VTC counters can be reconciled with what the
request really produced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from gtm import headers as gtm_headers
from gtm import tracing
from gtm.credentials import CLIENT_CREDENTIALS
from gtm.errors import AttemptFailed
from gtm.models import RouteRequest
from gtm.relay import (
    Ending,
    Relay,
    Upstream,
    all_busy,
    end_to_end,
    first_byte_timeout,
    open_aiohttp,
    skip_set,
)
from gtm.usage import USAGE_BODY_BYTES as USAGE_BODY_BYTES
from gtm.usage import UsageTap as UsageTap
from regional_lb import request as req
from regional_lb.errors import Overloaded, UpstreamFailed
from regional_lb.metrics import RegionalMetrics
from regional_lb.router import Inputs, RegionalRouter
from regional_lb.spill import PeerOption
from regional_lb.view import RegionalView, ZoneAccounting, ZoneState

log = logging.getLogger(__name__)

#: Retry-After of a 503 when every target tried was at capacity.
BUSY_RETRY_AFTER_S = 1.0
#: Characters of a retried upstream's error body kept in the client's message.
_DETAIL_CHARS = 300


#: ``gtm_regional_upstream_attempts``' outcome of a relayed response, by its ending.
_UPSTREAM_OUTCOME = {
    Ending.COMPLETED: "ok",
    Ending.CUT_RESET: "cut",
    Ending.CUT_TIMEOUT: "cut",
    Ending.CLIENT_GONE: "client-gone",
    Ending.CANCELLED: "cancelled",
    Ending.CUT_AFTER_DONE: "cut-after-done",
}


class TargetKind(StrEnum):
    ZONE = "zone"
    PEER = "peer"


@dataclass(frozen=True, slots=True)
class Target:
    """Where one attempt goes: a zone agent or a peer region's regional LB."""

    id: str
    url: str
    kind: TargetKind


@dataclass(frozen=True, slots=True)
class ProxySettings:
    max_attempts: int = 3
    connect_timeout_s: float = 2.0
    #: Longest wait for the first response byte (a long prompt's prefill, or a queue).
    first_byte_timeout_s: float = 120.0


@dataclass(frozen=True, slots=True)
class Carrier:
    """What every relay of one replica shares: the pool, settings and metrics."""

    session: Callable[[], aiohttp.ClientSession]
    metrics: RegionalMetrics
    settings: ProxySettings


@dataclass(frozen=True, slots=True)
class Trip:
    """What one admitted request carries either way out."""

    body: bytes
    tap: UsageTap
    #: ``time.perf_counter()`` when the request arrived (first-byte latency).
    arrived: float
    #: The request's model (the first-byte histogram's ``model`` label).
    model: str = ""


class _RegionalRelay(Relay[Target]):
    """The hooks both ways out share: aiohttp upstreams, usage tap, metrics, errors."""

    watch_chunks = True
    #: Client headers this way out never passes on (besides the hop-by-hop ones).
    withheld: frozenset[str] = frozenset()

    def __init__(
        self,
        request: web.Request,
        carrier: Carrier,
        trip: Trip,
        extra: Mapping[str, str],
        sign: Callable[[CIMultiDict[str]], None] | None = None,
    ) -> None:
        super().__init__(
            request,
            max_attempts=carrier.settings.max_attempts,
            breaks=carrier.metrics.stream_breaks,
        )
        self._carrier = carrier
        self._trip = trip
        self._extra = extra
        self._sign = sign
        skip = skip_set(*extra) | self.withheld
        self._skip = skip | gtm_headers.from_untrusted(request.headers.keys())

    def target_id(self, target: Target) -> str:
        return target.id

    async def open(self, target: Target) -> Upstream:
        settings = self._carrier.settings
        request = self.request
        headers = CIMultiDict(end_to_end(request.headers, self._skip))
        headers.extend(self._extra.items())
        tracing.inject(request, headers)  # this hop's span is the next one's parent
        if self._sign is not None:
            self._sign(headers)  # per attempt: the signature's time is the send's
        return await open_aiohttp(
            self._carrier.session(),
            target.url + request.path_qs,
            self._trip.body,
            headers.items(),
            first_byte_timeout(settings.connect_timeout_s, settings.first_byte_timeout_s),
        )

    def first_byte(self, target: Target) -> None:
        metrics, trip = self._carrier.metrics, self._trip
        model = metrics.model_label(trip.model)
        metrics.first_byte.labels(model).observe(max(0.0, time.perf_counter() - trip.arrived))

    def chunk(self, data: bytes) -> None:
        self._trip.tap.feed(data)

    def failed(self, target: Target, failure: AttemptFailed) -> None:
        self._carrier.metrics.upstream.labels(target.id, failure.reason).inc()

    def finished(self, target: Target, ending: Ending) -> None:
        # A client that left is not the target's failure: its own label, not "cut".
        self._carrier.metrics.upstream.labels(target.id, _UPSTREAM_OUTCOME[ending]).inc()

    def exhausted(self) -> Exception:
        failures = self.failures
        parts = []
        for failure in failures:
            detail = failure.detail
            if failure.status is not None:
                text = failure.body.decode("utf-8", "replace")[:_DETAIL_CHARS]
                detail = f"{detail} {text}"
            parts.append(f"{self._kind} {failure.target}: {detail}")
        detail = "; ".join(parts) or "no zone or peer region to send it to"
        if all_busy(failures):
            return Overloaded(
                f"every target tried is at capacity ({detail})",
                reason="upstream_busy",
                retry_after_s=BUSY_RETRY_AFTER_S,
            )
        return UpstreamFailed(f"the request failed before any response: {detail}")

    _kind = TargetKind.ZONE


class LocalRelay(_RegionalRelay):
    """To a zone agent of this region: the decision's zone first, then the router's
    next choice without the zones tried. ``precharged``: the zone the fair queue
    already charged this request to."""

    _kind = TargetKind.ZONE
    withheld = CLIENT_CREDENTIALS

    def __init__(
        self,
        request: web.Request,
        carrier: Carrier,
        trip: Trip,
        *,
        region: str,
        route_request: RouteRequest,
        inputs: Inputs,
        first: ZoneState,
        router: RegionalRouter,
        view: Callable[[], RegionalView],
        accounting: ZoneAccounting,
        dispatch: Callable[[], None],
        precharged: str | None,
        decision_id: str,
    ) -> None:
        super().__init__(request, carrier, trip, {req.HEADER_REQUEST_ID: route_request.request_id})
        self._region = region
        self._route_request = route_request
        self._inputs = inputs
        self._first = first
        self._router = router
        self._view = view
        self._accounting = accounting
        self._dispatch = dispatch
        self._pending = precharged
        self._decision_id = decision_id

    def next_target(self, tried: frozenset[str]) -> Target | None:
        zone: ZoneState | None = self._first
        if tried:
            again = self._router.place(
                self._route_request,
                self._view(),
                self._inputs,
                accounting=self._accounting,
                excluded=tried,
            )
            zone = None if again is None else again.zone
        if zone is None or zone.info.url is None:
            return None
        return Target(zone.id, zone.info.url, TargetKind.ZONE)

    def begin(self, target: Target) -> Callable[[], None]:
        request = self._route_request
        model, tokens = request.model, request.input_tokens
        if self._pending == target.id:
            self._pending = None
        else:
            self._accounting.start(target.id, model, tokens)

        def release() -> None:
            self._accounting.finish(target.id, model, tokens)
            self._dispatch()

        return release

    def response_headers(self, target: Target, headers: CIMultiDict[str]) -> None:
        for name, value in (
            (req.HEADER_REGION, self._region),
            (req.HEADER_ZONE, target.id),
            (req.HEADER_DECISION, self._decision_id),
            (req.HEADER_REQUEST_ID, self._route_request.request_id),
        ):
            headers.setdefault(name, value)

    async def forward(self) -> web.StreamResponse:
        try:
            return await super().forward()
        finally:
            pending = self._pending
            if pending is not None:  # placed from the queue but never sent
                request = self._route_request
                self._accounting.finish(pending, request.model, request.input_tokens)
                self._dispatch()


class PeerRelay(_RegionalRelay):
    """Spillover to a peer region's regional LB, inside the residency-allowed set."""

    _kind = TargetKind.PEER

    def __init__(
        self,
        request: web.Request,
        carrier: Carrier,
        trip: Trip,
        *,
        options: tuple[PeerOption, ...],
        allowed: frozenset[str],
        headers: Mapping[str, str],
        chain: str,
        request_id: str,
        on_spill: Callable[[str], None],
        sign: Callable[[CIMultiDict[str]], None] | None = None,
    ) -> None:
        super().__init__(request, carrier, trip, headers, sign)
        self._options = options
        self._allowed = allowed
        self._chain = chain
        self._request_id = request_id
        self._on_spill = on_spill

    def next_target(self, tried: frozenset[str]) -> Target | None:
        for option in self._options:
            if option.region not in tried and option.region in self._allowed:
                return Target(option.region, option.url, TargetKind.PEER)
        return None

    def begin(self, target: Target) -> None:
        # Audited before the bytes leave: the record says where the request went.
        self._on_spill(target.id)

    def response_headers(self, target: Target, headers: CIMultiDict[str]) -> None:
        for name, value in (
            (req.HEADER_REGION, target.id),
            (req.HEADER_SPILLED_FROM, self._chain),
            (req.HEADER_REQUEST_ID, self._request_id),
        ):
            headers.setdefault(name, value)


__all__ = [
    "USAGE_BODY_BYTES",
    "Carrier",
    "LocalRelay",
    "PeerRelay",
    "ProxySettings",
    "Target",
    "TargetKind",
    "Trip",
    "UsageTap",
]

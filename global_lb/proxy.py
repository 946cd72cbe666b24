"""The front door's data path: what the global tier plugs into the core relay
(:mod:`gtm.relay`).

A decided request goes to its region's regional LB (the first endpoint); only once a
forward failed are the decision's fallbacks ordered, and tried in turn — all inside the
residency-allowed set, ``max_attempts`` regions in all. :class:`RegionRelay` adds:

* **Retries** on a connect failure, a timeout or reset before the first byte, or a 5xx.
  A 4xx (429 from quotas included) is the region's answer and goes to the client.
* **Charges**: each attempt is charged to its region in the in-flight ledger before the
  first byte (decisions made meanwhile see it) and taken back when the attempt ends.
* **Audit**: a retry on another region is a new residency decision, audited before
  the bytes leave.
* **Headers**: upstream, ``x-gtm-hops`` + 1, ``x-gtm-decision-id``, ``x-request-id``
  (the client's when sane, else a new one), the client's location as the front door
  found it (``x-gtm-client-country``, ``x-gtm-location-source``) and
  ``X-Forwarded-For`` extended with the peer. Every tier-only ``x-gtm-`` header the
  client sent is dropped (:func:`gtm.headers.from_untrusted`: a client could claim a
  country whose rules suit it, a spill chain or a peer token); with the tiers' key
  (``--peer-token``) each attempt is signed (``x-gtm-tier-auth``, :mod:`gtm.trust`), so
  the regional LB believes the location instead of locating the client again. Back,
  ``x-gtm-region`` (the regional LB's own when it spilled, else the region tried) and
  ``x-gtm-decision-id``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from global_lb.config import FrontDoorConfig
from global_lb.errors import UpstreamUnavailable
from global_lb.inflight import InflightLedger
from global_lb.metrics import GlobalMetrics
from global_lb.request import (
    CLIENT_COUNTRY_HEADER,
    DECISION_HEADER,
    FORWARDED_FOR_HEADER,
    HOPS_HEADER,
    REGION_HEADER,
)
from global_lb.router import RouteOutcome
from global_lb.view import GlobalView, RegionState
from gtm import access, tracing
from gtm import headers as gtm_headers
from gtm.clock import Clock
from gtm.errors import AttemptFailed
from gtm.inbound import request_id
from gtm.relay import (
    Ending,
    Failure,
    Relay,
    Upstream,
    end_to_end,
    first_byte_timeout,
    open_aiohttp,
    skip_set,
)
from gtm.trust import GLOBAL_ISSUER, ClientLocation, TierKey, assert_location, from_location
from gtm.usage import UsageTap

log = logging.getLogger(__name__)

#: Client headers the front door sets itself (besides the hop-by-hop ones).
_SKIP_UPSTREAM = skip_set(CLIENT_COUNTRY_HEADER, FORWARDED_FOR_HEADER, HOPS_HEADER, DECISION_HEADER)


def attempts(outcome: RouteOutcome, count: int) -> Iterator[str]:
    """Where a request is forwarded: the chosen region, then — only once a forward
    failed — its first fallbacks, ``count`` in all. Ordering the fallbacks costs about
    as much as a cold decision over many regions (global_lb.ranking.Ranking); a
    forward that succeeds never needs them."""
    assert outcome.region is not None
    if count <= 0:
        return
    yield outcome.region
    yield from outcome.targets(count)[1:]


class RegionRelay(Relay[RegionState]):
    """One request's attempts on the regions of its decision."""

    #: A region's 4xx is its answer (quotas, residency): only 5xx moves on.
    def retry_status(self, status: int) -> bool:
        return status >= 500

    def __init__(
        self,
        request: web.Request,
        *,
        config: FrontDoorConfig,
        view: GlobalView,
        outcome: RouteOutcome,
        body: bytes,
        hops: int,
        model: str,
        input_tokens: int,
        session: Callable[[], aiohttp.ClientSession],
        ledger: InflightLedger,
        metrics: GlobalMetrics,
        clock: Clock,
        audit: Callable[[str], None],
        client: ClientLocation | None = None,
        served: Callable[[str], None] | None = None,
        stream: bool = False,
        arrived: float | None = None,
    ) -> None:
        super().__init__(request, max_attempts=config.max_attempts, breaks=metrics.stream_breaks)
        self._config = config
        self._view = view
        self._outcome = outcome
        self._body = body
        self._model = model
        self._input_tokens = input_tokens
        self._session = session
        self._ledger = ledger
        self._metrics = metrics
        self._clock = clock
        self._audit = audit
        #: Told the region that served the request when it is not the decision's.
        self._served = served
        self._regions = attempts(outcome, config.max_attempts)
        #: ``time.perf_counter()`` at the request's arrival (latency metrics).
        self._arrived = time.perf_counter() if arrived is None else arrived
        #: Reads the relayed response's usage (token counters).
        self._tap = UsageTap(stream)
        #: The region that served the response (the regional LB's answer when it spilled).
        self._served_region = ""
        self._label: str | None = None
        self._previous = ""
        self._last_error = "no region to try"
        if client is None:
            client = from_location(outcome.location, via_proxy=False)
        skip = _SKIP_UPSTREAM | gtm_headers.from_untrusted(request.headers.keys())
        headers = CIMultiDict(end_to_end(request.headers, skip))
        assert_location(headers, client)
        forwarded = request.headers.get(FORWARDED_FOR_HEADER)
        peer = request.remote or ""
        headers[FORWARDED_FOR_HEADER] = f"{forwarded}, {peer}" if forwarded else peer
        headers[HOPS_HEADER] = str(hops + 1)
        headers[DECISION_HEADER] = outcome.decision_id
        headers[gtm_headers.REQUEST_ID] = request_id(request.headers)
        tracing.inject(request, headers)  # this hop's span is the next one's parent
        self._headers = headers
        token = config.peer_token
        self._key = TierKey(token.get_secret_value()) if token is not None else None

    def next_target(self, tried: frozenset[str]) -> RegionState | None:
        for region_id in self._regions:
            region = self._view.by_id.get(region_id)
            if region is not None and region.endpoints:
                return region
            self._last_error = f"region {region_id} has no regional LB endpoint"
            self._metrics.forward_attempts.labels(region_id, "no-endpoint").inc()
            self._previous = region_id
        return None

    def target_id(self, target: RegionState) -> str:
        return target.id

    def begin(self, target: RegionState) -> Callable[[], None]:
        if self._previous:  # a retry: a new residency decision, audited
            self._metrics.retries.labels(self._previous, target.id).inc()
            self._audit(target.id)
        self._previous = target.id
        # Charged before the first byte: decisions made while this one waits for its
        # answer see it. Taken back when the attempt ends (a failure never loaded the
        # region; a finished request no longer does), unless a summary took it over.
        charge = self._ledger.charge(target.id, self._model, self._input_tokens, self._clock.wall())
        return lambda: self._ledger.cancel(charge)

    async def open(self, target: RegionState) -> Upstream:
        config = self._config
        url = target.endpoints[0].url.rstrip("/") + self.request.path_qs
        headers = self._headers
        if self._key is not None:  # per attempt: the signature's time is the send's
            headers = headers.copy()
            self._key.sign(headers, issuer=GLOBAL_ISSUER, now=self._clock.wall())
        return await open_aiohttp(
            self._session(),
            url,
            self._body,
            headers.items(),
            first_byte_timeout(config.connect_timeout, config.first_byte_timeout),
        )

    def first_byte(self, target: RegionState) -> None:
        self._metrics.forward_attempts.labels(target.id, "ok").inc()

    #: The relayed bytes feed the usage tap (front-door token counters).
    watch_chunks = True

    def chunk(self, data: bytes) -> None:
        self._tap.feed(data)

    def response_headers(self, target: RegionState, headers: CIMultiDict[str]) -> None:
        # The regional LB names the region that served the request, which differs from
        # the one tried when it spilled to a peer: keep its answer so clients (and a
        # client-side residency audit) see where the bytes were really processed.
        region = headers.setdefault(REGION_HEADER, target.id)
        self._served_region = region
        metrics = self._metrics
        model = self._model_label()
        elapsed = time.perf_counter() - self._arrived
        metrics.first_byte.labels(region, model).observe(elapsed)
        headers[DECISION_HEADER] = self._outcome.decision_id
        if self._served is not None and region != self._outcome.region:
            self._served(region)

    def failed(self, target: RegionState, failure: AttemptFailed) -> None:
        if failure.kind == Failure.STATUS:
            result = f"http-{failure.status}"
            self._last_error = f"{target.id}: HTTP {failure.status}"
        else:
            result = "connect-error"
            self._last_error = f"{target.id}: {failure.detail}"
        self._metrics.forward_attempts.labels(target.id, result).inc()

    def finished(self, target: RegionState, ending: Ending) -> None:
        metrics = self._metrics
        if ending in (Ending.CUT_RESET, Ending.CUT_TIMEOUT):
            metrics.forward_attempts.labels(target.id, "broken-stream").inc()
        region = self._served_region or target.id
        model = self._model_label()
        metrics.request_seconds.labels(region, model).observe(time.perf_counter() - self._arrived)
        usage = self._tap.usage(self._input_tokens)
        prompt = self._input_tokens if usage is None else usage.input_tokens
        completion = 0 if usage is None else usage.output_tokens
        metrics.tokens.labels(region, model, "prompt").inc(prompt)
        metrics.tokens.labels(region, model, "completion").inc(completion)
        if usage is not None:  # the access line's tokens: what the response reported
            access.tell(
                self.request,
                tokens_in=usage.input_tokens,
                tokens_out=usage.output_tokens,
                tokens_source=access.TokenSource.USAGE,
            )

    def _model_label(self) -> str:
        # Bounded (gtm.metrics.ModelLabel). Only a decided request is relayed, and a
        # model no allowed region serves is refused before (404), so the values are the
        # fleet's models; the view's loads are not the test (a region without a summary
        # yet still serves).
        label = self._label
        if label is None:
            label = self._label = self._metrics.model_label(self._model)
        return label

    def exhausted(self) -> Exception:
        return UpstreamUnavailable(f"no regional LB could take the request: {self._last_error}")

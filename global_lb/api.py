"""The front door's HTTP handlers: OpenAI-compatible API in, the chosen region's
regional LB out (:mod:`global_lb.proxy`), and the decision API ``POST /v1/route``.

Per request (``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``):

1. the tenant from the API key (``Authorization: Bearer …``, policies' tenant
   directory; the first use of a key costs one scrypt, run off the event loop);
2. the client address: the peer, or — only when the peer is a trusted proxy — the
   rightmost address in ``X-Forwarded-For`` that is not itself a trusted proxy (the
   leftmost entries are whatever the client claimed);
3. its location (GeoIP), the residency verdict and the region (:mod:`global_lb.router`);
   every residency decision is audited (no prompt text);
4. the body is forwarded to the region's regional LB and the response streamed back as
   it arrives (SSE included), with ``x-gtm-region`` and ``x-gtm-decision-id`` added
   (:class:`global_lb.proxy.RegionRelay`: retries before the first byte, only to the
   decision's fallbacks inside the residency-allowed set). A hop counter
   (``x-gtm-hops``) stops loops between tiers.

Refusals, each a JSON error in OpenAI's shape whose ``code`` names the reason:

* **451** Unavailable For Legal Reasons (RFC 7725) when the residency policy allows *no*
  region for this tenant, data class and client country: a legal refusal, the same on
  every retry, so no ``Retry-After`` (the OpenAI SDKs do not retry it);
* **503** + ``Retry-After`` when allowed regions exist but none is available now (down,
  drained, failing health checks): a transient condition the SDKs retry — the request
  is still never sent outside the allowed set;
* 404 when no allowed region serves the model; 401 for a bad key.

An unknown path is 404 ``unknown_url`` and a wrong method 405 ``method_not_allowed``
with ``Allow``, in the same shape, by the middleware every tier installs
(:func:`gtm.openai_errors.error_middleware`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge
from pydantic import Field, ValidationError

from global_lb.audit import AuditSink
from global_lb.config import FrontDoorConfig
from global_lb.errors import BadRequest, UpstreamUnavailable
from global_lb.geo import GeoLocator, IPAddress, Location, client_address
from global_lb.inflight import InflightLedger
from global_lb.metrics import GlobalMetrics
from global_lb.plugins.affinity import RegionMemory
from global_lb.proxy import RegionRelay
from global_lb.request import (
    CHAT,
    COMPLETIONS,
    DATA_CLASS_HEADER,
    DECISION_HEADER,
    EMBEDDINGS,
    HOPS_HEADER,
    check_data_class,
    hops,
    parse_body,
)
from global_lb.router import GlobalRouter, RouteOutcome
from global_lb.view import GlobalView
from gtm import access, tracing
from gtm.clock import Clock
from gtm.geo import CachedLocator
from gtm.http_limits import limited_app
from gtm.inbound import bearer_key, read_body, tenant_of
from gtm.models import ClientInfo, Frozen, Identifier, ModelName, RouteRequest, Tier
from gtm.openai_errors import ApiError, error_middleware, openai_error
from gtm.serve import add_service_routes
from gtm.tracing import OFF, Tracing
from gtm.trust import LocationOrigin, client_of, from_location
from policies import ApiKeyError, ResidencyQuery, decision_record
from policies.documents import Tenant

log = logging.getLogger(__name__)

#: ``Retry-After`` (whole seconds) of a 503 when no allowed region is available: about
#: two health rounds, the time a recovered region takes to be trusted again.
NO_REGION_RETRY_AFTER_S = 1
#: ``Retry-After`` of the 503 before the first policy generation is in force: the policy
#: arrives with the first snapshot, within a second of a start (as the regional LB says).
NOT_READY_RETRY_AFTER_S = 1


class FrontDoor:
    """The aiohttp application of the front door and ``POST /v1/route``."""

    def __init__(
        self,
        *,
        config: FrontDoorConfig,
        view: Callable[[], GlobalView | None],
        router: GlobalRouter,
        locator: GeoLocator,
        metrics: GlobalMetrics,
        registry: CollectorRegistry,
        audit: AuditSink,
        clock: Clock,
        session: Callable[[], aiohttp.ClientSession],
        ready: Callable[[], bool] = lambda: True,
        ledger: InflightLedger | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        self._config = config
        self._tracing = tracing
        self._base_view = view
        #: What this front door sent each region since its last summary: decisions read
        #: it (global_lb.inflight), so one summary interval does not herd to one region.
        self._ledger = ledger if ledger is not None else InflightLedger()
        self._router = router
        #: Where this front door sent prompts' prefixes (regions), remembered when it
        #: forwards them.
        self._regions_sent = RegionMemory()
        self._metrics = metrics
        self._registry = registry
        self._audit = audit
        self._clock = clock
        self._session = session
        self._ready = ready
        self._locations = CachedLocator(locator)
        Gauge(
            "gtm_global_location_cache_entries",
            "Client addresses whose location is remembered (bounded, least recently "
            "used dropped first).",
            registry=registry,
        ).set_function(lambda: len(self._locations))
        Gauge(
            "gtm_global_placement_memory_entries",
            "Prompt blocks remembered with the region they were sent to (bounded by the "
            "memory's capacity and time to live).",
            registry=registry,
        ).set_function(lambda: len(self._regions_sent.memory))

    @property
    def ledger(self) -> InflightLedger:
        return self._ledger

    def _view(self) -> GlobalView | None:
        """The current view with this front door's unseen charges on it."""
        base = self._base_view()
        return None if base is None else self._ledger.view(base, self._clock.wall())

    def app(self) -> web.Application:
        app = limited_app(
            self._config.limits,
            client_max_size=self._config.max_body_bytes,
            middlewares=[error_middleware("front door")],
        )
        app.router.add_post(CHAT, self._forward)
        app.router.add_post(COMPLETIONS, self._forward)
        app.router.add_post(EMBEDDINGS, self._forward)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/route", self._route)
        add_service_routes(app, registry=self._registry, readyz=self._readyz)
        access.install(app, Tier.GLOBAL)
        tracing.install(app, Tier.GLOBAL, self._tracing)
        return app

    # ------------------------------------------------------------------ service

    async def _readyz(self, request: web.Request) -> web.Response:
        view = self._view()
        ready = view is not None and self._ready()
        body = {"ready": ready, "regions": 0 if view is None else len(view.available_ids())}
        return web.json_response(body, status=200 if ready else 503)

    async def _models(self, request: web.Request) -> web.Response:
        view = self._view()
        models: set[str] = set()
        for region in () if view is None else view.regions:
            if region.available and region.summary is not None:
                models.update(m.model for m in region.summary.models if m.healthy_gpus > 0)
        data = [{"id": m, "object": "model", "owned_by": "gtm"} for m in sorted(models)]
        return web.json_response({"object": "list", "data": data})

    # ------------------------------------------------------------------ deciding

    async def _tenant(self, request: web.Request, view: GlobalView) -> Tenant | web.Response:
        key = bearer_key(request.headers)
        if key is None:
            return openai_error(
                401, "missing API key (Authorization: Bearer ...)", "invalid_request_error",
                "invalid_api_key",
            )  # fmt: skip
        try:
            return await tenant_of(view.policy.tenants, key)
        except ApiKeyError as exc:
            return openai_error(401, str(exc), "invalid_request_error", "invalid_api_key")

    def forget_locations(self) -> None:
        """Drop every remembered client location (the GeoIP database changed)."""
        self._locations.clear()

    def _locate(self, address: IPAddress | None) -> Location | None:
        if address is None:
            return None
        return self._locations.locate(address)

    def _decide(
        self,
        view: GlobalView,
        *,
        tenant: str,
        model: str,
        input_tokens: int,
        max_output_tokens: int,
        data_class: str,
        location: Location | None,
        channel: str,
        origin: LocationOrigin | None = None,
        prefix_hashes: tuple[int, ...] = (),
        tokens_per_block: float = 0.0,
    ) -> RouteOutcome:
        started = self._clock.monotonic()
        client = ClientInfo(
            country=None if location is None else location.country,
            location=None if location is None else location.point,
        )
        request = RouteRequest(
            request_id=uuid.uuid4().hex,
            model=model,
            input_tokens=input_tokens,
            max_output_tokens=max_output_tokens,
            tenant=tenant,
            client=client,
            data_class=data_class,
            prefix_hashes=prefix_hashes,
        )
        outcome = self._router.decide(request, view, location)
        if prefix_hashes and outcome.region is not None and self._config.affinity:
            # Back to the region the prompt's prefix was just sent to, while it may
            # take it (residency-allowed, available, within its load bound).
            region = self._regions_sent.place(
                outcome.region,
                request,
                view,
                outcome.verdict.allowed,
                point=client.location,
                country=client.country,
                tokens_per_block=tokens_per_block,
                now=self._clock.wall(),  # the region summaries' clock
            )
            if region != outcome.region:
                outcome = dataclasses.replace(outcome, region=region)
        elapsed = self._clock.monotonic() - started
        self._metrics.decision_seconds.labels(channel, str(outcome.cached).lower()).observe(elapsed)
        label = outcome.region or f"refused:{outcome.refusal}"
        self._metrics.decisions.labels(channel, label).inc()
        if outcome.refusal is not None:
            self._metrics.refusals.labels(channel, _refusal_reason(outcome)).inc()
        if origin is None:
            origin = from_location(location, via_proxy=False).origin
        self._audit_decision(view, tenant, data_class, model, outcome, outcome.region, origin)
        return outcome

    def _audit_decision(
        self,
        view: GlobalView,
        tenant: str,
        data_class: str,
        model: str,
        outcome: RouteOutcome,
        region: str | None,
        origin: LocationOrigin,
    ) -> None:
        country = None if outcome.location is None else outcome.location.country
        record = decision_record(
            ResidencyQuery(tenant, model, data_class, country),
            outcome.verdict,
            time=self._clock.wall(),
            policy_revision=view.policy_revision,
            chosen_region=region,
            decision_id=outcome.decision_id,
            location_source=origin.value,
        )
        self._audit.append(record)

    # ------------------------------------------------------------------ /v1/route

    async def _route(self, request: web.Request) -> web.Response:
        view = self._view()
        if view is None:
            return _not_ready()
        try:
            body = await request.json()
        except ValueError:
            return openai_error(
                400, "the body is not valid JSON", "invalid_request_error", "bad_json"
            )
        if not isinstance(body, dict):
            return openai_error(
                400, "the body must be an object", "invalid_request_error", "bad_body"
            )
        try:
            query = _RouteQuery.model_validate(body)
        except ValidationError as exc:
            return _bad_request(_first_error(exc))
        tenant = query.tenant
        if "Authorization" in request.headers or tenant is None:
            found = await self._tenant(request, view)
            if isinstance(found, web.Response):
                return found
            tenant = found.id
        address = query.client_ip
        if address is None:
            address = self._client(request)
        outcome = self._decide(
            self._view() or view,  # as of now, not of the first byte (see _forward)
            tenant=tenant,
            model=query.model,
            input_tokens=query.input_tokens,
            max_output_tokens=query.max_output_tokens,
            data_class=query.data_class,
            location=self._locate(address),
            channel="route",
        )
        return web.json_response(outcome.to_json(), headers={DECISION_HEADER: outcome.decision_id})

    def _client(self, request: web.Request) -> IPAddress | None:
        return client_address(
            request.remote,
            request.headers.get("X-Forwarded-For"),
            self._config.trusted_proxies,
        )

    # ------------------------------------------------------------------ forwarding

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        view = self._view()
        if view is None:
            return _not_ready()
        crossed = hops(request.headers.get(HOPS_HEADER))
        if crossed >= self._config.max_hops:
            return openai_error(508, "routing loop detected", "server_error", "loop_detected")
        found = await self._tenant(request, view)
        if isinstance(found, web.Response):
            return found
        try:
            body = await read_body(request)
        except ApiError as exc:  # 413
            return exc.response()
        # The view again, now that the body is in: the requests that arrived with this
        # one were decided and charged while it authenticated and read its body, and
        # must be seen. With the view of its first byte, a burst herded to one region.
        view = self._view() or view
        data_class = request.headers.get(DATA_CLASS_HEADER, "default")
        forwarded = request.headers.get("X-Forwarded-For")
        address, via = client_of(request.remote, forwarded, self._config.trusted_proxies)
        location = self._locate(address)
        client = from_location(location, via_proxy=via)
        access.tell(
            request,
            tenant=found.id,
            country=client.country,
            location_source=client.origin,
            client=address,
        )
        try:
            facts = parse_body(request.path, body)
            check_data_class(data_class)
            outcome = self._decide(
                view,
                tenant=found.id,
                model=facts.model,
                input_tokens=facts.input_tokens,
                max_output_tokens=facts.max_output_tokens,
                data_class=data_class,
                location=location,
                channel="http",
                origin=client.origin,
                prefix_hashes=facts.prefix_hashes,
                tokens_per_block=facts.tokens_per_block,
            )
        except BadRequest as exc:  # before a decision: OpenAI's 400 naming the parameter
            return exc.response()
        except (ValidationError, ValueError) as exc:
            message = _first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            return openai_error(400, message, "invalid_request_error", "invalid_request")
        if tracing.traced(request):
            tracing.decided(
                request,
                reasons=outcome.reasons,
                allowed=outcome.allowed,
                predicted_ttft_ms=outcome.predicted_ttft_ms,
                cached=outcome.cached,
            )
        access.tell(
            request,
            model=facts.model,
            decision_id=outcome.decision_id,
            tokens_in=facts.input_tokens,
            tokens_out=facts.max_output_tokens,
            tokens_source=access.TokenSource.ESTIMATE,
        )
        if outcome.refusal is not None:
            return _refusal_response(outcome)
        sent_at = self._clock.wall()

        def served(region: str) -> None:
            # Spilled (or retried) elsewhere: the next turn goes back where it was served.
            if not self._config.affinity:
                return
            self._regions_sent.served(
                facts.prefix_hashes, region, sent_at=sent_at, tokens=facts.input_tokens
            )

        relay = RegionRelay(
            request,
            config=self._config,
            view=view,
            outcome=outcome,
            body=body,
            hops=crossed,
            model=facts.model,
            input_tokens=facts.input_tokens,
            session=self._session,
            ledger=self._ledger,
            metrics=self._metrics,
            clock=self._clock,
            audit=lambda region: self._audit_decision(
                view, found.id, data_class, facts.model, outcome, region, client.origin
            ),
            client=client,
            served=served if facts.prefix_hashes else None,
            stream=facts.stream,
            arrived=arrived,
        )
        try:
            return await relay.forward()
        except UpstreamUnavailable as exc:
            return exc.response(**{DECISION_HEADER: outcome.decision_id})


def _not_ready() -> web.Response:
    """503 before the first policy generation is in force: a state every restart passes
    through, so the client is told when to retry (as the regional LB does)."""
    return openai_error(
        503,
        "no policy in force yet",
        "service_unavailable",
        "not_ready",
        **{"Retry-After": str(NOT_READY_RETRY_AFTER_S)},
    )


def _bad_request(message: str) -> web.Response:
    return openai_error(400, message, "invalid_request_error", "invalid_request")


class _RouteQuery(Frozen):
    """``POST /v1/route``: what to decide for. The tenant comes from the API key, or —
    for a trusted data plane calling without one — from ``tenant``."""

    model: ModelName
    tenant: Identifier | None = None
    client_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    input_tokens: int = Field(default=0, ge=0, le=100_000_000)
    max_output_tokens: int = Field(default=0, ge=0, le=100_000_000)
    data_class: Identifier = "default"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _refusal_reason(outcome: RouteOutcome) -> str:
    if outcome.refusal is not None and outcome.refusal.value == "residency":
        return f"residency:{outcome.verdict.reason.value}"
    return str(outcome.refusal)


def _refusal_response(outcome: RouteOutcome) -> web.Response:
    reason = _refusal_reason(outcome)
    kinds = {
        451: ("residency_refused", "Unavailable for legal reasons: the residency policy "
              "allows no region for this request"),
        503: ("service_unavailable", "no region the residency policy allows for this "
              "request is available now; retry later"),
        404: ("model_not_found", "no allowed region serves this model"),
    }  # fmt: skip
    kind, message = kinds[outcome.http_status]
    headers = {DECISION_HEADER: outcome.decision_id}
    if outcome.http_status == 503:
        headers["Retry-After"] = str(NO_REGION_RETRY_AFTER_S)
    body: dict[str, Any] = {
        "error": {
            "message": f"{message} ({reason}; {outcome.detail})",
            "type": kind,
            "code": reason,
            "param": None,
            "decision_id": outcome.decision_id,
            "allowed_regions": list(outcome.allowed),
        }
    }
    return web.json_response(body, status=outcome.http_status, headers=headers)


__all__ = ["FrontDoor", "client_address"]

"""The regional LB's HTTP handlers: the OpenAI endpoints, ``/v1/models``, ``/healthz``,
``/readyz`` and ``/metrics``.

One OpenAI request, in order (each step's refusal is an OpenAI-shaped error):

1. admission (:mod:`regional_lb.admission`): the trust boundary and the client's
   location (:mod:`regional_lb.location`), hops, API key, body, model, residency, quota;
2. the regional decision (:mod:`regional_lb.router`): a zone, a peer region, the fair
   queue (:mod:`regional_lb.dispatch`), or a refusal (451 residency, 404 model, 503);
3. the data path (:mod:`regional_lb.proxy`): to the zone (:class:`~regional_lb.proxy.
   LocalRelay`) or the peer (:class:`~regional_lb.proxy.PeerRelay`), retried before the
   first byte. The quota ticket is reconciled with the reported usage, or refunded when
   nothing ran. A client that goes away cancels the handler: the queue entry, the
   ticket and the zone accounting are all released in ``finally`` blocks.

Every residency decision is audited with where the client's location came from: the
region chosen when a zone here takes the request, each peer before a spill's bytes
leave, ``None`` for a refusal (admission audits residency refusals itself).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict
from prometheus_client import Gauge

from gtm import access, tracing
from gtm.http_limits import limited_app
from gtm.models import Tier
from gtm.openai_errors import error_middleware
from gtm.serve import add_service_routes
from gtm.trust import assert_location
from regional_lb import request as req
from regional_lb.admission import Admitted
from regional_lb.errors import ModelNotFound, Overloaded, ResidencyRefused
from regional_lb.location import FORWARDED_FOR
from regional_lb.plugins.prefix import ZoneMemory
from regional_lb.proxy import LocalRelay, PeerRelay, Trip, UsageTap
from regional_lb.quota import Usage
from regional_lb.router import Reason, RegionalDecision, Route
from regional_lb.view import zone_candidates

if TYPE_CHECKING:
    from regional_lb.app import RegionalService


class RegionalApi:
    """The handlers of one regional LB replica (:class:`~regional_lb.app.RegionalService`)."""

    def __init__(self, service: RegionalService) -> None:
        self._service = service
        #: Where this replica sent prompts' prefixes (zones), remembered at dispatch.
        self._zones_sent = ZoneMemory()
        Gauge(
            "gtm_regional_placement_memory_entries",
            "Prompt blocks remembered with the zone they were sent to (bounded by the "
            "memory's capacity and time to live).",
            registry=service.registry,
        ).set_function(lambda: len(self._zones_sent.memory))

    def build_app(self) -> web.Application:
        service = self._service
        metrics = service.metrics
        app = limited_app(
            service.settings.limits,
            client_max_size=service.settings.max_body_bytes,
            middlewares=[
                error_middleware(
                    "regional LB",
                    lambda route, status: metrics.responses.labels(route, str(status)).inc(),
                )
            ],
        )
        for endpoint in req.Endpoint:
            app.router.add_post(endpoint.value, self._handler(endpoint))
        app.router.add_get("/v1/models", self.models)
        add_service_routes(app, registry=service.registry, readyz=self.readyz)
        access.install(app, Tier.REGIONAL, region=service.settings.region)
        tracing.install(app, Tier.REGIONAL, service.tracing, region=service.settings.region)
        return app

    def _handler(self, endpoint: req.Endpoint) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.handle(request, endpoint)

        return handle

    # ------------------------------------------------------------------ OpenAI

    async def handle(self, request: web.Request, endpoint: req.Endpoint) -> web.StreamResponse:
        service = self._service
        metrics = service.metrics
        arrived = time.perf_counter()
        admitted, ticket = await service.admission.admit(request, endpoint)
        _tell(request, admitted)
        tap = UsageTap(admitted.stream)
        usage: Usage | None = None
        try:
            started = time.perf_counter()
            decision = self._decide(admitted)
            metrics.decision.observe(time.perf_counter() - started)
            precharged: str | None = None
            label = decision.route.value
            if decision.route is Route.QUEUE:
                try:
                    decision = await service.dispatcher.wait(admitted)
                except Overloaded:
                    service.admission.audit_admitted(admitted, None)
                    raise
                precharged = decision.zone.id if decision.zone is not None else None
            metrics.admitted.labels(admitted.tenant.id, label).inc()
            tracing.decided(request, route=label, reasons=(decision.reason.value,))
            trip = Trip(admitted.body, tap, arrived, admitted.route_request.model)
            if decision.route is Route.SPILL:
                response = await self._spill(request, admitted, decision, trip)
            else:
                service.admission.audit_admitted(admitted, service.settings.region)
                response = await self._local(request, admitted, decision, trip, precharged)
            usage = tap.usage(admitted.cost.input_tokens)
            if usage is not None:
                access.tell(
                    request,
                    tokens_in=usage.input_tokens,
                    tokens_out=usage.output_tokens,
                    tokens_source=access.TokenSource.USAGE,
                )
            if precharged is not None and usage is not None:
                # VTC charges output as it is generated: correct the dispatch estimate.
                delta = usage.output_tokens - admitted.cost.output_tokens
                service.dispatcher.queue.reconcile(admitted.tenant.id, admitted.band, delta)
            return response
        finally:
            if ticket is not None:
                # Nothing relayed: nothing ran (refused, timed out in the queue, failed
                # upstream, or the client left first). A response cut short keeps the
                # estimate; a finished one is charged what it reported.
                now = service.clock.monotonic()
                service.limiter.finish(ticket, now, usage=usage, refund=not tap.relayed_any)

    def _decide(self, admitted: Admitted) -> RegionalDecision:
        service = self._service
        router = service.router
        if router is None:
            raise Overloaded("no routing profile yet", reason="not_ready", retry_after_s=1.0)
        decision = router.decide(
            admitted.route_request,
            service.view,
            admitted.inputs,
            accounting=service.accounting,
            now=service.clock.monotonic(),
            now_wall=service.clock.wall(),
            keeper=self._zones_sent if service.settings.affinity else None,
        )
        if decision.route is Route.REFUSE:
            self._refuse(admitted, decision)
        return decision

    def _refuse(self, admitted: Admitted, decision: RegionalDecision) -> None:
        region = self._service.settings.region
        tenant, model = admitted.tenant.id, admitted.route_request.model
        self._service.metrics.rejected.labels(tenant, decision.reason.value).inc()
        self._service.admission.audit_admitted(admitted, None)
        if decision.reason is Reason.RESIDENCY:
            raise ResidencyRefused(
                f"residency does not allow region {region} for this request",
                code="region_not_allowed",
            )
        if decision.reason is Reason.MODEL_NOT_FOUND:
            raise ModelNotFound(model, region)
        raise Overloaded(
            f"no healthy zone in region {region} serves {model} now, and no "
            "allowed peer region can take it",
            reason="no_healthy_zone",
            retry_after_s=1.0,
        )

    async def _local(
        self,
        request: web.Request,
        admitted: Admitted,
        decision: RegionalDecision,
        trip: Trip,
        precharged: str | None,
    ) -> web.StreamResponse:
        service = self._service
        router = service.router
        if router is None or decision.zone is None:
            raise Overloaded(
                "no zone to send the request to", reason="not_ready", retry_after_s=1.0
            )
        # Back to the zone the prompt's prefix was just sent to, while it can take it.
        route_request = admitted.route_request
        first = decision.zone
        if service.settings.affinity:
            first = self._zones_sent.place(
                decision.zone,
                route_request,
                lambda: zone_candidates(service.view, route_request.model, service.accounting),
                tokens_per_block=admitted.inputs.tokens_per_block,
                now=service.clock.wall(),  # the zone summaries' clock
                movable=precharged is None,
            )
        return await LocalRelay(
            request,
            service.carrier,
            trip,
            region=service.settings.region,
            route_request=admitted.route_request,
            inputs=admitted.inputs,
            first=first,
            router=router,
            view=lambda: service.view,
            accounting=service.accounting,
            dispatch=service.dispatcher.dispatch,
            precharged=precharged,
            decision_id=admitted.decision_id,
        ).forward()

    async def _spill(
        self,
        request: web.Request,
        admitted: Admitted,
        decision: RegionalDecision,
        trip: Trip,
    ) -> web.StreamResponse:
        service = self._service
        settings = service.settings
        chain = ",".join((*admitted.hops.spilled_from, settings.region))
        headers: CIMultiDict[str] = CIMultiDict(
            {
                req.HEADER_HOPS: str(admitted.hops.hops + 1),
                req.HEADER_SPILLED_FROM: chain,
                req.HEADER_DATA_CLASS: admitted.query.data_class,
                req.HEADER_PRIORITY: admitted.band.value,
                req.HEADER_REQUEST_ID: admitted.route_request.request_id,
                req.HEADER_DECISION: admitted.decision_id,
            }
        )
        # The peer believes the location when the spill is signed; without a key it
        # locates the client itself, from the address appended here.
        assert_location(headers, admitted.location)
        forwarded = request.headers.get(FORWARDED_FOR)
        peer = request.remote or ""
        headers[FORWARDED_FOR] = f"{forwarded}, {peer}" if forwarded else peer

        def on_spill(region: str) -> None:
            service.admission.audit_admitted(admitted, region)
            service.metrics.spills.labels(region, decision.reason.value).inc()
            service.spill_out.add(service.clock.monotonic())

        return await PeerRelay(
            request,
            service.carrier,
            trip,
            options=(*filter(None, (decision.peer,)), *decision.fallbacks),
            allowed=admitted.verdict.allowed,
            headers=headers,
            chain=chain,
            request_id=admitted.route_request.request_id,
            on_spill=on_spill,
            sign=service.locator.sign,
        ).forward()

    # ------------------------------------------------------------------ service

    async def models(self, request: web.Request) -> web.Response:
        names = sorted(
            {
                m.model
                for z in self._service.view.zones.values()
                if z.summary is not None
                for m in z.summary.models
            }
        )
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "gtm"} for n in names]
        return web.json_response({"object": "list", "data": data})

    async def readyz(self, request: web.Request) -> web.Response:
        service = self._service
        view = service.view
        body = {
            "region": service.settings.region,
            "replica": service.settings.replica_id,
            "ready": service.ready,
            "policy_generation": view.policy_generation,
            "snapshot_revision": view.snapshot_revision,
            "snapshot_stale": service.snapshots.stale,
            "zones": len(view.zones),
            "quota_lease_valid": service.leases.lease_valid(),
            "queued": len(service.queue),
        }
        return web.json_response(body, status=200 if service.ready else 503)


def _tell(request: web.Request, admitted: Admitted) -> None:
    """What the access line needs of an admitted request besides what admission told it
    (tenant, model, location): ids and estimates only."""
    access.tell(
        request,
        decision_id=admitted.decision_id,
        spill_from=",".join(admitted.hops.spilled_from) or None,
        tokens_in=admitted.cost.input_tokens,
        tokens_out=admitted.cost.output_tokens,
        tokens_source=access.TokenSource.ESTIMATE,
    )

"""Admission: who is asking, whether residency lets this region serve it, and quota.

In order (each refusal is an OpenAI-shaped error, :mod:`regional_lb.errors`):

0. the trust boundary (:mod:`regional_lb.location`): the ``x-gtm-`` headers are believed
   only from a proven tier (a signed front door or peer region); from a client that
   came here directly they are dropped;
1. hops (``x-gtm-hops``: 508 past the loop limit), the tenant from the API key (401;
   the first use of a key costs one scrypt, run off the event loop), the body
   (400/413), the model the tenant may use (403);
2. residency: the client's location — a proven tier's signed assertion, else located
   here with the front door's GeoIP and trusted-proxy rules, else unknown and the
   policy's ``unknown_client_location`` decides — and the verdict for (tenant, model,
   data class, client country); 451 when it refuses or excludes this region. Every
   residency decision of this tier is audited with where the location came from (no
   prompt text): refusals here, the region chosen or each spill by the handlers
   (:meth:`Admission.audit`);
3. quota (:mod:`regional_lb.quota`, shares from :mod:`regional_lb.leases`): 429 +
   Retry-After. A request spilled in by a peer region that proves it is one was
   charged at its origin and is not charged again.

What passes is an :class:`Admitted` request and its quota :class:`~regional_lb.quota.Ticket`
(``None`` when nothing was charged here).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from gtm import access
from gtm.clock import Clock
from gtm.errors import GtmError
from gtm.inbound import bearer_key, read_body, tenant_of
from gtm.models import ClientInfo, Priority, RouteRequest
from gtm.openai_request import parse_json_body
from gtm.policy_store import ActivePolicy
from gtm.trust import ClientLocation, Inbound, LocationOrigin
from policies import ApiKeyError, AuditWriter, ResidencyQuery, Verdict, decision_record
from policies.documents import Quotas, Tenant
from regional_lb import request as req
from regional_lb.config import RegionalSettings
from regional_lb.errors import (
    LoopDetected,
    ModelNotAllowed,
    Overloaded,
    QuotaExceeded,
    ResidencyRefused,
    Unauthorized,
)
from regional_lb.location import ClientLocator
from regional_lb.metrics import RegionalMetrics
from regional_lb.quota import Cost, QuotaLimiter, Rejection, Ticket
from regional_lb.router import Inputs
from regional_lb.summary import RateMeter

log = logging.getLogger(__name__)


_NOT_LOCATED = ClientLocation(None, LocationOrigin.UNKNOWN_POLICY)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request past authentication, residency and quota."""

    tenant: Tenant
    route_request: RouteRequest
    inputs: Inputs
    verdict: Verdict
    query: ResidencyQuery
    cost: Cost
    band: Priority
    hops: req.HopInfo
    stream: bool
    body: bytes
    #: Where the client is and how this tier knows.
    location: ClientLocation = _NOT_LOCATED
    #: The id of this tier's residency decision (the front door's, when it sent it).
    decision_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The request's headers as this tier believes them.
    sender: Inbound | None = None


def has_limits(quotas: Quotas) -> bool:
    """Whether a tenant's quotas limit anything (unlimited tenants need no leases)."""
    return any(
        v is not None
        for v in (
            quotas.requests_per_minute,
            quotas.input_tokens_per_minute,
            quotas.output_tokens_per_minute,
            quotas.weighted_tokens_per_minute,
            quotas.max_concurrent,
        )
    )


class Admission:
    """Authentication, residency and quota for one replica."""

    def __init__(
        self,
        settings: RegionalSettings,
        *,
        policy: Callable[[], ActivePolicy | None],
        limiter: QuotaLimiter,
        metrics: RegionalMetrics,
        clock: Clock,
        audit: AuditWriter | None,
        spill_in: RateMeter,
        locator: ClientLocator,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._limiter = limiter
        self._metrics = metrics
        self._clock = clock
        #: Where residency decisions are appended (None: not kept).
        self.audit_log = audit
        self._spill_in = spill_in
        self.locator = locator

    async def admit(
        self, request: web.Request, endpoint: req.Endpoint
    ) -> tuple[Admitted, Ticket | None]:
        """The admitted request and its quota ticket, or the refusal raised."""
        settings = self._settings
        sender = self.locator.inbound(request)
        headers = sender.headers
        hops = req.hop_info(headers)
        if hops.hops > settings.loop_hops:
            raise LoopDetected(hops.hops, settings.loop_hops)
        policy = self._policy()
        if policy is None:
            raise Overloaded("no policy in force yet", reason="not_ready", retry_after_s=1.0)
        tenant = await authenticate(request, policy)
        access.tell(request, tenant=tenant.id)  # its refusals' access lines name it too
        raw = await read_body(request)
        facts = req.body_facts(parse_json_body(raw), endpoint)
        if not policy.tenants.allows_model(tenant.id, facts.model):
            raise ModelNotAllowed(facts.model)
        if sender.trusted:
            req.client_country(headers)  # a proven tier's garbled country is a 400
        location = self.locator.locate(request, sender)
        country = location.country
        access.tell(request, model=facts.model, country=country, location_source=location.origin)
        query = ResidencyQuery(tenant.id, facts.model, req.data_class(headers), country)
        verdict = policy.engine.allowed_regions(query)
        band = req.priority(headers, Priority(tenant.priority.value))
        decision_id = req.decision_id(headers) if sender.trusted else None
        decision_id = decision_id or uuid.uuid4().hex
        self._check_residency(tenant, query, verdict, location, decision_id)
        output = facts.max_output_tokens
        cost = Cost(
            facts.input_tokens,
            output if output is not None else settings.quota.default_output_tokens,
        )
        route_request = RouteRequest(
            request_id=req.request_id(headers),
            model=facts.model,
            input_tokens=facts.input_tokens,
            max_output_tokens=cost.output_tokens,
            tenant=tenant.id,
            client=ClientInfo(country=country),
            data_class=query.data_class,
            priority=band,
            prefix_hashes=facts.prefix_hashes,
        )
        inputs = Inputs(
            allowed=verdict.allowed,
            on_saturation=verdict.on_saturation,
            hops=hops.hops,
            spilled_from=hops.spilled_from,
            # The verdict is this tier's own over a location it established (or a
            # proven tier asserted), the unknown-location rule applied as at the front
            # door: spilling inside it cannot leave the client's jurisdiction. What a
            # spill still needs is loop safety: a peer believes the hop count and the
            # spill chain only when they are signed, so without the tiers' key (the
            # router's ``spill_requires_client_country``) a replica does not spill.
            client_country_known=self.locator.key is not None,
            tokens_per_block=facts.tokens_per_block,
        )
        admitted = Admitted(
            tenant,
            route_request,
            inputs,
            verdict,
            query,
            cost,
            band,
            hops,
            facts.stream,
            raw,
            location,
            decision_id,
            sender,
        )
        if hops.spilled_from:
            self._metrics.spilled_in.labels(hops.spilled_from[-1]).inc()
            self._spill_in.add(self._clock.monotonic())
        if hops.spilled_from and sender.from_region:
            return admitted, None  # charged at its origin region
        return admitted, self._charge(tenant.id, cost)

    def _check_residency(
        self,
        tenant: Tenant,
        query: ResidencyQuery,
        verdict: Verdict,
        location: ClientLocation,
        decision_id: str,
    ) -> None:
        region = self._settings.region
        if verdict.refused or region not in verdict.allowed:
            self.audit(query, verdict, None, location=location, decision_id=decision_id)
            self._metrics.rejected.labels(tenant.id, "residency").inc()
            code = verdict.reason.value if verdict.refused else "region_not_allowed"
            raise ResidencyRefused(
                f"residency refuses this request in region {region}: {verdict.explain()}",
                code=code,
            )

    def _charge(self, tenant: str, cost: Cost) -> Ticket:
        result = self._limiter.admit(tenant, cost, self._clock.monotonic())
        if isinstance(result, Rejection):
            self._metrics.rejected.labels(tenant, result.reason.value).inc()
            raise QuotaExceeded(
                result.message, reason=result.reason.value, retry_after_s=result.retry_after_s
            )
        return result

    def from_peer(self, headers: Mapping[str, str]) -> bool:
        """Whether the request proves it comes from a peer regional LB."""
        return self.locator.check(headers).from_region

    def audit(
        self,
        query: ResidencyQuery,
        verdict: Verdict,
        chosen: str | None,
        *,
        location: ClientLocation | None = None,
        decision_id: str | None = None,
    ) -> None:
        """Append a residency decision to the audit log (a failure is logged, not raised:
        the log is the audit writer's to keep healthy)."""
        policy = self._policy()
        if self.audit_log is None or policy is None:
            return
        try:
            record = decision_record(
                query,
                verdict,
                time=self._clock.wall(),
                policy_revision=policy.revision,
                chosen_region=chosen,
                decision_id=decision_id or uuid.uuid4().hex,
                location_source=None if location is None else location.origin.value,
            )
            self.audit_log.append(record)
        except (ValueError, GtmError, OSError) as exc:
            log.error("could not audit a residency decision: %s", exc)

    def audit_admitted(self, admitted: Admitted, chosen: str | None) -> None:
        """Audit the decision for an admitted request: the region chosen (this one, or
        a peer it is spilled to) or ``None`` when it is refused after all."""
        self.audit(
            admitted.query,
            admitted.verdict,
            chosen,
            location=admitted.location,
            decision_id=admitted.decision_id,
        )


async def authenticate(request: web.Request, policy: ActivePolicy) -> Tenant:
    """The tenant of the request's API key (``Authorization: Bearer …``), or 401."""
    key = bearer_key(request.headers)
    if key is None:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    try:
        return await tenant_of(policy.tenants, key)
    except ApiKeyError as exc:
        raise Unauthorized(str(exc)) from None

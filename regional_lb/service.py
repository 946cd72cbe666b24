"""The regional LB service: admission, zone choice, spillover, the fair queue, the proxy.

One request, in order (each step's refusal is an OpenAI-shaped error):

1. hops (``x-gtm-hops``: 508 past the loop limit), the tenant from the API key (401),
   the body (400/413), the model the tenant may use (403);
2. residency: the verdict for (tenant, model, data class, client country); 451 when it
   refuses or excludes this region. Every residency refusal and every spill decision
   is audited (no prompt text);
3. quota admission (:mod:`regional_lb.quota`, shares from :mod:`regional_lb.leases`):
   429 + Retry-After. A request spilled in by a peer that proves it is one
   (``x-gtm-peer-token``) was charged at its origin and is not charged again;
4. the regional decision (:mod:`regional_lb.router`): a zone, a peer region, the fair
   queue (:mod:`regional_lb.fairqueue`, 503 + Retry-After at the band's TTL or when
   full), or a refusal;
5. the data path (:mod:`regional_lb.proxy`), retrying before the first byte on another
   zone (or the next peer); the quota ticket is reconciled with the reported usage, or
   refunded when nothing ran. A client that goes away cancels the handler: the queue
   entry, the ticket and the zone accounting are all released in ``finally`` blocks.

Background (supervised tasks): the fleet snapshot watcher, the policy watcher (unless
the policy is static), view rebuilds on every snapshot or policy change, capacity-lease
rounds, the region-summary publisher, and queue expiry/dispatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gtm.clock import Clock
from gtm.errors import GtmError
from gtm.http_limits import HttpLimits, limited_app
from gtm.models import ClientInfo, Endpoint, Priority, RouteRequest
from gtm.openai_errors import error_middleware
from gtm.openai_request import parse_json_body
from gtm.policy_store import ActivePolicy, PolicyWatcher
from gtm.state.memory import MemoryStore
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.store import StateStore
from gtm.tasks import TaskSupervisor
from gtm.tls import TlsMaterial, client_session_options, connector_ssl
from gtm.tls import scheme as tls_scheme
from policies import ApiKeyError, AuditWriter, ResidencyQuery, Verdict, decision_record
from policies.documents import Quotas, Tenant
from regional_lb import request as req
from regional_lb.errors import (
    ApiError,
    LoopDetected,
    ModelNotAllowed,
    ModelNotFound,
    Overloaded,
    QuotaExceeded,
    ResidencyRefused,
    Unauthorized,
)
from regional_lb.fairqueue import FairQueue, QueueSettings, RefusalReason
from regional_lb.leases import CapacityLeases, LeaseSettings
from regional_lb.metrics import RegionalMetrics
from regional_lb.priority import DemandMeter
from regional_lb.profiles import PROFILE_NAME, build, profile_spec, regional_registry
from regional_lb.proxy import Forwarder, ProxySettings, Relayed, Target, TargetKind, UsageTap
from regional_lb.quota import (
    Cost,
    Grant,
    QuotaLimiter,
    QuotaSettings,
    Rejection,
    Ticket,
    Usage,
    pool_of,
)
from regional_lb.router import (
    Inputs,
    Reason,
    RegionalDecision,
    RegionalRouter,
    Route,
    RouterSettings,
)
from regional_lb.spill import PeerOption, SpillLimiter
from regional_lb.summary import RateMeter, SummaryPublisher, build_summary
from regional_lb.view import RegionalView, ViewBuilder, ViewSettings, ZoneAccounting

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RegionalSettings:
    """Everything one regional LB replica is configured with."""

    region: str
    replica_id: str
    #: Where peers and the global tier reach this replica (published in the summary).
    advertise_url: str | None = None
    quota: QuotaSettings = field(default_factory=QuotaSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    proxy: ProxySettings = field(default_factory=ProxySettings)
    view: ViewSettings = field(default_factory=ViewSettings)
    profile_name: str = PROFILE_NAME
    summary_interval_s: float = 1.0
    #: How often queued requests are expired and re-offered to zones, s.
    queue_tick_s: float = 0.05
    #: Shared secret proving a request comes from a peer regional LB (spilled, already
    #: charged); ``None``: spilled requests are charged again (the safe default).
    peer_token: str | None = None
    #: ``x-gtm-hops`` above this is a loop (508); spills themselves stop at
    #: ``router.spill.max_hops``.
    loop_hops: int = 4
    max_body_bytes: int = 16 << 20
    #: Header/body/JSON-depth limits, slow-client timeouts, per-client concurrency.
    limits: HttpLimits = field(default_factory=HttpLimits)


@dataclass(slots=True)
class _Waiter:
    """A request waiting in the fair queue for a zone."""

    request: RouteRequest
    inputs: Inputs
    future: asyncio.Future[RegionalDecision]
    decision: RegionalDecision | None = None


@dataclass(frozen=True, slots=True)
class _Admitted:
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


class RegionalService:
    """One regional LB replica. :meth:`start`, then serve :meth:`build_app`; :meth:`stop`."""

    def __init__(
        self,
        settings: RegionalSettings,
        *,
        store: StateStore,
        clock: Clock,
        registry: CollectorRegistry,
        policy: ActivePolicy | None = None,
        audit: AuditWriter | None = None,
        tls: TlsMaterial | None = None,
    ) -> None:
        self.settings = settings
        #: mTLS: serve only TLS (global/region/ops clients), dial zones and peer regions
        #: with our certificate, never in the clear.
        self.tls = tls
        self._client_ssl = tls.client_context() if tls is not None else None
        self._store = store
        self._clock = clock
        self.registry = registry
        self._static_policy = policy
        self._audit = audit
        self.tasks = TaskSupervisor(registry=registry, clock=clock, component="regional")
        self.snapshots = SnapshotWatcher(
            store, clock=clock, registry=registry, component="regional"
        )
        self.policies = (
            None if policy is not None else PolicyWatcher(store, clock=clock, registry=registry)
        )
        self.queue: FairQueue[_Waiter] = FairQueue(settings.queue)
        self.metrics = RegionalMetrics(registry, self.queue.depth)
        self.limiter = QuotaLimiter(settings.quota)
        self.leases = CapacityLeases(
            store,
            self.limiter,
            replica_id=settings.replica_id,
            region=settings.region,
            clock=clock,
            registry=registry,
            settings=settings.leases,
        )
        self.accounting = ZoneAccounting()
        self._builder = ViewBuilder(settings.region, settings=settings.view)
        self._spill_limiter = SpillLimiter(settings.router.spill)
        # Admitted demand outlives the router a policy change replaces.
        self._demand = DemandMeter(settings.router.capacity.demand_decay_s)
        self._spill_in = RateMeter()
        self._spill_out = RateMeter()
        self._publisher = SummaryPublisher(
            store, settings.region, ttl_s=3 * settings.summary_interval_s
        )
        self._session: aiohttp.ClientSession | None = None
        self.forwarder = Forwarder(self._client, self.metrics, settings.proxy)
        self._policy: ActivePolicy | None = None
        self._router: RegionalRouter | None = None
        self._view = self._builder.build(self.snapshots.current, None, now_wall=clock.wall())
        self._synced = False
        self._advertise = settings.advertise_url

    # ------------------------------------------------------------------ lifecycle

    @property
    def view(self) -> RegionalView:
        return self._view

    @property
    def policy(self) -> ActivePolicy | None:
        return self._policy

    @property
    def ready(self) -> bool:
        return self._policy is not None and self._router is not None and self._synced

    @property
    def advertise_url(self) -> str | None:
        return self._advertise

    def advertise(self, url: str) -> None:
        """Where peers and the global tier reach this replica (when not configured)."""
        if self._advertise is None:
            self._advertise = url

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                connector=aiohttp.TCPConnector(
                    limit=0, enable_cleanup_closed=True, ssl=connector_ssl(self._client_ssl)
                ),
                **client_session_options(self._client_ssl),
            )
        return self._session

    async def start(self) -> None:
        if self._static_policy is not None:
            self._apply_policy(self._static_policy)
        tasks = self.tasks
        if isinstance(self._store, MemoryStore):
            # The embedded store expires leases lazily; watchers (ours) need it on time.
            self._store.run_expiry(tasks)
        if self.tls is not None:
            tasks.spawn("tls-reload", self.tls.run())
        tasks.spawn("snapshot-watch", self.snapshots.run())
        tasks.spawn("snapshot-follow", self._follow_snapshots())
        if self.policies is not None:
            tasks.spawn("policy-watch", self.policies.run())
            tasks.spawn("policy-follow", self._follow_policies(self.policies))
        tasks.run_loop(
            "quota-leases", self.leases.refresh, interval=self.settings.leases.refresh_interval
        )
        tasks.run_loop(
            "region-summary", self.publish_summary, interval=self.settings.summary_interval_s
        )
        tasks.run_loop("queue", self._tick, interval=self.settings.queue_tick_s)

    def refuse_waiting(self) -> None:
        """Answer every queued request 503 (shutting down): they would not be served."""
        for item in list(self.queue.items()):
            self.queue.remove(item)
            if not item.payload.future.done():
                item.payload.future.set_exception(
                    Overloaded(
                        "the regional LB is shutting down", reason="shutdown", retry_after_s=1.0
                    )
                )

    async def stop(self) -> None:
        """Stop background work, refuse what still waits, give leases back."""
        await self.tasks.aclose()
        self.refuse_waiting()
        for name, action in (("leases", self.leases.close), ("summary", self._publisher.withdraw)):
            try:
                await action()
            except GtmError as exc:
                log.warning("could not release %s on shutdown: %s", name, exc)
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------ state

    async def _follow_snapshots(self) -> None:
        await self.snapshots.wait_ready()
        self._synced = True
        revision = -1
        while True:
            snapshot = await self.snapshots.wait_for_revision(revision + 1)
            revision = snapshot.revision
            self.rebuild()

    async def _follow_policies(self, watcher: PolicyWatcher) -> None:
        generation = 0
        while True:
            active = await watcher.wait_for_generation(generation + 1)
            generation = active.generation
            try:
                self._apply_policy(active)
            except GtmError as exc:  # e.g. a routing profile this tier cannot build
                log.error(
                    "policy generation %d not applied; keeping the one in force: %s",
                    generation,
                    exc,
                )

    def _apply_policy(self, policy: ActivePolicy) -> None:
        """Swap in a policy: profile, router, tenants' quotas and lease pools."""
        spec = profile_spec(policy, self.settings.profile_name)
        profile = build(spec, registry=regional_registry(), metrics=self.metrics.routing)
        self._router = RegionalRouter(
            profile,
            saturation_filter=spec.profile.filters[-1],
            settings=self.settings.router,
            limiter=self._spill_limiter,
            demand=self._demand,
        )
        now = self._clock.monotonic()
        pools = {}
        for tenant in policy.policy_set.tenants.values():
            pool = pool_of(tenant, self.settings.region)
            grant = Grant(
                self.settings.leases.safe_share, math.inf, self.settings.leases.safe_share
            )
            self.limiter.configure(tenant.id, tenant.quotas, pool.fraction, grant, now)
            if has_limits(tenant.quotas):
                pools[tenant.id] = pool
        for tenant_id in self.limiter.tenants():
            if tenant_id not in policy.policy_set.tenants:
                self.limiter.forget(tenant_id)
        self.leases.configure(pools)
        self._policy = policy
        self.rebuild()

    def rebuild(self) -> None:
        """A new view from the current snapshot and policy; then serve the queue."""
        self._view = self._builder.build(
            self.snapshots.current,
            self._policy,
            now_wall=self._clock.wall(),
            stale=self.snapshots.stale,
        )
        self.accounting.observe(self._view.zones)
        self._dispatch()

    async def publish_summary(self) -> None:
        now = self._clock.monotonic()
        url = self._advertise
        summary = build_summary(
            self._view,
            self.accounting,
            published_at=self._clock.wall(),
            spill_in_per_s=self._spill_in.rate(now),
            spill_out_per_s=self._spill_out.rate(now),
            endpoints=(Endpoint(url=url),) if url else (),
        )
        await self._publisher.publish(summary)

    # ------------------------------------------------------------------ the queue

    async def _tick(self) -> None:
        now = self._clock.monotonic()
        for item in self.queue.expire(now):
            waiter = item.payload
            self.metrics.rejected.labels(item.tenant, RefusalReason.QUEUE_TIMEOUT.value).inc()
            if not waiter.future.done():
                ttl = self.queue.settings.band(item.band).ttl_s
                waiter.future.set_exception(
                    Overloaded(
                        f"the region is saturated; the request waited {ttl:g} s in the "
                        f"{item.band.value} queue without a zone",
                        reason=RefusalReason.QUEUE_TIMEOUT.value,
                        retry_after_s=max(1.0, ttl / 10),
                    )
                )
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand queued requests to zones with room, highest band and smallest VTC first."""
        router = self._router
        if router is None or len(self.queue) == 0:
            return
        view = self._view
        now = self._clock.monotonic()

        # Models no zone can take more of now: their other queued heads are not tried
        # again in this pass (dispatching only ever makes zones fuller).
        full: set[str] = set()

        def placeable(waiter: _Waiter) -> bool:
            # Places the head as a side effect: pop() takes exactly the first head this
            # accepts, so the stashed decision is the popped request's.
            if waiter.future.done():
                return True
            if waiter.request.model in full:
                return False
            waiter.decision = router.place(
                waiter.request, view, waiter.inputs, accounting=self.accounting
            )
            if waiter.decision is None:
                full.add(waiter.request.model)
            return waiter.decision is not None

        while (item := self.queue.pop(placeable)) is not None:
            waiter = item.payload
            decision = waiter.decision
            if waiter.future.done() or decision is None or decision.zone is None:
                continue
            self.accounting.start(
                decision.zone.id, waiter.request.model, waiter.request.input_tokens
            )
            self.metrics.queue_wait.labels(item.band.value).observe(item.waited(now))
            waiter.future.set_result(decision)

    async def _wait_in_queue(self, admitted: _Admitted) -> RegionalDecision:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(admitted.route_request, admitted.inputs, loop.create_future())
        offered = self.queue.offer(
            admitted.tenant.id,
            admitted.band,
            waiter,
            input_tokens=admitted.cost.input_tokens,
            output_tokens=admitted.cost.output_tokens,
            now=self._clock.monotonic(),
        )
        if isinstance(offered, RefusalReason):
            raise Overloaded(
                f"the region is saturated and its {admitted.band.value} queue is full "
                f"({offered.value})",
                reason=offered.value,
                retry_after_s=max(1.0, self.queue.settings.band(admitted.band).ttl_s / 10),
            )
        self._dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client went away while waiting. Take the request out of the queue; if
            # a zone had just been charged for it, give that back.
            future = waiter.future
            if future.cancelled() or not future.done():
                self.queue.remove(offered)
            elif future.exception() is None:
                zone = future.result().zone
                if zone is not None:
                    request = admitted.route_request
                    self.accounting.finish(zone.id, request.model, request.input_tokens)
                    self._dispatch()
            raise

    # ------------------------------------------------------------------ requests

    async def handle(self, request: web.Request, endpoint: req.Endpoint) -> web.StreamResponse:
        arrived = time.perf_counter()
        admitted, ticket = await self._admit(request, endpoint)
        tap = UsageTap(admitted.stream)
        usage: Usage | None = None
        try:
            started = time.perf_counter()
            decision = self._decide(admitted)
            self.metrics.decision.observe(time.perf_counter() - started)
            precharged: str | None = None
            label = decision.route.value
            if decision.route is Route.QUEUE:
                decision = await self._wait_in_queue(admitted)
                precharged = decision.zone.id if decision.zone is not None else None
            self.metrics.admitted.labels(admitted.tenant.id, label).inc()
            if decision.route is Route.SPILL:
                response, _ = await self._spill(request, admitted, decision, tap, arrived)
            else:
                response, _ = await self._local(
                    request, admitted, decision, tap, arrived, precharged
                )
            usage = tap.usage(admitted.cost.input_tokens)
            if precharged is not None and usage is not None:
                # VTC charges output as it is generated: correct the dispatch estimate.
                delta = usage.output_tokens - admitted.cost.output_tokens
                self.queue.reconcile(admitted.tenant.id, admitted.band, delta)
            return response
        finally:
            if ticket is not None:
                # Nothing relayed: nothing ran (refused, timed out in the queue, failed
                # upstream, or the client left first). A response cut short keeps the
                # estimate; a finished one is charged what it reported.
                now = self._clock.monotonic()
                self.limiter.finish(ticket, now, usage=usage, refund=not tap.relayed_any)

    def _decide(self, admitted: _Admitted) -> RegionalDecision:
        router = self._router
        if router is None:
            raise Overloaded("no routing profile yet", reason="not_ready", retry_after_s=1.0)
        decision = router.decide(
            admitted.route_request,
            self._view,
            admitted.inputs,
            accounting=self.accounting,
            now=self._clock.monotonic(),
            now_wall=self._clock.wall(),
        )
        if decision.route is Route.REFUSE:
            self._refuse(admitted, decision)
        return decision

    def _refuse(self, admitted: _Admitted, decision: RegionalDecision) -> None:
        tenant, model = admitted.tenant.id, admitted.route_request.model
        self.metrics.rejected.labels(tenant, decision.reason.value).inc()
        if decision.reason is Reason.RESIDENCY:
            raise ResidencyRefused(
                f"residency does not allow region {self.settings.region} for this request",
                code="region_not_allowed",
            )
        if decision.reason is Reason.MODEL_NOT_FOUND:
            raise ModelNotFound(model, self.settings.region)
        raise Overloaded(
            f"no healthy zone in region {self.settings.region} serves {model} now, and no "
            "allowed peer region can take it",
            reason="no_healthy_zone",
            retry_after_s=1.0,
        )

    async def _admit(
        self, request: web.Request, endpoint: req.Endpoint
    ) -> tuple[_Admitted, Ticket | None]:
        headers = request.headers
        hops = req.hop_info(headers)
        if hops.hops > self.settings.loop_hops:
            raise LoopDetected(hops.hops, self.settings.loop_hops)
        policy = self._policy
        if policy is None:
            raise Overloaded("no policy in force yet", reason="not_ready", retry_after_s=1.0)
        tenant = await self._authenticate(request, policy)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise ApiError(
                413, f"the request body is too large: {exc.text}", code="body_too_large"
            ) from None
        facts = req.body_facts(parse_json_body(raw), endpoint)
        if not policy.tenants.allows_model(tenant.id, facts.model):
            raise ModelNotAllowed(facts.model)
        trusted = self._from_peer(headers)
        country = req.client_country(headers)
        query = ResidencyQuery(tenant.id, facts.model, req.data_class(headers), country)
        verdict = policy.engine.allowed_regions(query)
        band = req.priority(headers, Priority(tenant.priority.value))
        if verdict.refused or self.settings.region not in verdict.allowed:
            self._audit_decision(query, verdict, None)
            self.metrics.rejected.labels(tenant.id, "residency").inc()
            code = verdict.reason.value if verdict.refused else "region_not_allowed"
            raise ResidencyRefused(
                f"residency refuses this request in region {self.settings.region}: "
                f"{verdict.explain()}",
                code=code,
            )
        output = facts.max_output_tokens
        cost = Cost(
            facts.input_tokens,
            output if output is not None else self.settings.quota.default_output_tokens,
        )
        rid = req.request_id(headers)
        route_request = RouteRequest(
            request_id=rid,
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
            client_country_known=country is not None,
            tokens_per_block=facts.tokens_per_block,
        )
        admitted = _Admitted(
            tenant, route_request, inputs, verdict, query, cost, band, hops, facts.stream, raw
        )
        if hops.spilled_from:
            self.metrics.spilled_in.labels(hops.spilled_from[-1]).inc()
            self._spill_in.add(self._clock.monotonic())
        if hops.spilled_from and trusted:
            return admitted, None  # charged at its origin region
        result = self.limiter.admit(tenant.id, cost, self._clock.monotonic())
        if isinstance(result, Rejection):
            self.metrics.rejected.labels(tenant.id, result.reason.value).inc()
            raise QuotaExceeded(
                result.message, reason=result.reason.value, retry_after_s=result.retry_after_s
            )
        return admitted, result

    async def _authenticate(self, request: web.Request, policy: ActivePolicy) -> Tenant:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        loop = asyncio.get_running_loop()
        try:
            # The first use of a key costs one scrypt: keep it off the event loop.
            return await loop.run_in_executor(None, policy.tenants.authenticate, key.strip())
        except ApiKeyError as exc:
            raise Unauthorized(str(exc)) from None

    def _from_peer(self, headers: Mapping[str, str]) -> bool:
        token = self.settings.peer_token
        offered = headers.get(req.HEADER_PEER_TOKEN)
        if token is None or offered is None:
            return False
        return hmac.compare_digest(token.encode(), offered.encode())

    def _audit_decision(
        self,
        query: ResidencyQuery,
        verdict: Verdict,
        chosen: str | None,
    ) -> None:
        if self._audit is None or self._policy is None:
            return
        try:
            record = decision_record(
                query,
                verdict,
                time=self._clock.wall(),
                policy_revision=self._policy.revision,
                chosen_region=chosen,
                decision_id=uuid.uuid4().hex,
            )
            self._audit.append(record)
        except (ValueError, GtmError, OSError) as exc:
            log.error("could not audit a residency decision: %s", exc)

    # ------------------------------------------------------------------ forwarding

    async def _local(
        self,
        request: web.Request,
        admitted: _Admitted,
        decision: RegionalDecision,
        tap: UsageTap,
        arrived: float,
        precharged: str | None,
    ) -> tuple[web.StreamResponse, Relayed]:
        router = self._router
        if router is None or decision.zone is None:
            raise Overloaded(
                "no zone to send the request to", reason="not_ready", retry_after_s=1.0
            )
        model, tokens = admitted.route_request.model, admitted.route_request.input_tokens
        first = decision.zone
        decision_id = uuid.uuid4().hex
        charged = {"pending": precharged}

        def next_target(tried: frozenset[str]) -> Target | None:
            if not tried:
                zone = first
            else:
                again = router.place(
                    admitted.route_request,
                    self._view,
                    admitted.inputs,
                    accounting=self.accounting,
                    excluded=tried,
                )
                if again is None or again.zone is None:
                    return None
                zone = again.zone
            url = zone.info.url
            if url is None:
                return None
            return Target(
                zone.id,
                url,
                TargetKind.ZONE,
                {req.HEADER_REQUEST_ID: admitted.route_request.request_id},
            )

        def start(target: Target) -> Callable[[], None]:
            if charged["pending"] == target.id:
                charged["pending"] = None
            else:
                self.accounting.start(target.id, model, tokens)

            def release() -> None:
                self.accounting.finish(target.id, model, tokens)
                self._dispatch()

            return release

        def response_headers(target: Target) -> Mapping[str, str]:
            return {
                req.HEADER_REGION: self.settings.region,
                req.HEADER_ZONE: target.id,
                req.HEADER_DECISION: decision_id,
                req.HEADER_REQUEST_ID: admitted.route_request.request_id,
            }

        try:
            return await self.forwarder.forward(
                request,
                admitted.body,
                next_target=next_target,
                start=start,
                response_headers=response_headers,
                tap=tap,
                arrived=arrived,
            )
        finally:
            if charged["pending"] is not None:  # placed from the queue but never sent
                self.accounting.finish(charged["pending"], model, tokens)
                self._dispatch()

    async def _spill(
        self,
        request: web.Request,
        admitted: _Admitted,
        decision: RegionalDecision,
        tap: UsageTap,
        arrived: float,
    ) -> tuple[web.StreamResponse, Relayed]:
        options: list[PeerOption] = [*filter(None, (decision.peer,)), *decision.fallbacks]
        region = self.settings.region
        chain = ",".join((*admitted.hops.spilled_from, region))
        headers = {
            req.HEADER_HOPS: str(admitted.hops.hops + 1),
            req.HEADER_SPILLED_FROM: chain,
            req.HEADER_DATA_CLASS: admitted.query.data_class,
            req.HEADER_PRIORITY: admitted.band.value,
            req.HEADER_REQUEST_ID: admitted.route_request.request_id,
        }
        if admitted.query.client_country is not None:
            headers[req.HEADER_CLIENT_COUNTRY] = admitted.query.client_country
        if self.settings.peer_token is not None:
            headers[req.HEADER_PEER_TOKEN] = self.settings.peer_token

        def next_target(tried: frozenset[str]) -> Target | None:
            for option in options:
                if option.region not in tried and option.region in admitted.verdict.allowed:
                    return Target(option.region, option.url, TargetKind.PEER, headers)
            return None

        def start(target: Target) -> Callable[[], None]:
            # Audited before the bytes leave: the record says where the request went.
            self._audit_decision(admitted.query, admitted.verdict, target.id)
            self.metrics.spills.labels(target.id, decision.reason.value).inc()
            self._spill_out.add(self._clock.monotonic())
            return lambda: None

        def response_headers(target: Target) -> Mapping[str, str]:
            return {
                req.HEADER_REGION: target.id,
                req.HEADER_SPILLED_FROM: chain,
                req.HEADER_REQUEST_ID: admitted.route_request.request_id,
            }

        return await self.forwarder.forward(
            request,
            admitted.body,
            next_target=next_target,
            start=start,
            response_headers=response_headers,
            tap=tap,
            arrived=arrived,
        )

    # ------------------------------------------------------------------ HTTP

    def build_app(self) -> web.Application:
        app = limited_app(
            self.settings.limits,
            client_max_size=self.settings.max_body_bytes,
            middlewares=[
                error_middleware(
                    "regional LB",
                    lambda route, status: self.metrics.responses.labels(route, str(status)).inc(),
                )
            ],
        )
        for endpoint in req.Endpoint:
            app.router.add_post(endpoint.value, self._handler(endpoint))
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_endpoint)
        return app

    def _handler(self, endpoint: req.Endpoint) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.handle(request, endpoint)

        return handle

    async def _models(self, request: web.Request) -> web.Response:
        names = sorted(
            {
                m.model
                for z in self._view.zones.values()
                if z.summary is not None
                for m in z.summary.models
            }
        )
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "gtm"} for n in names]
        return web.json_response({"object": "list", "data": data})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        view = self._view
        body = {
            "region": self.settings.region,
            "replica": self.settings.replica_id,
            "ready": self.ready,
            "policy_generation": view.policy_generation,
            "snapshot_revision": view.snapshot_revision,
            "snapshot_stale": self.snapshots.stale,
            "zones": len(view.zones),
            "quota_lease_valid": self.leases.lease_valid(),
            "queued": len(self.queue),
        }
        return web.json_response(body, status=200 if self.ready else 503)

    async def _metrics_endpoint(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )


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


#: Seconds in-flight requests get to finish when the server stops (then cancelled).
SHUTDOWN_GRACE_S = 5.0


@contextlib.asynccontextmanager
async def serving(service: RegionalService, host: str, port: int) -> AsyncIterator[web.AppRunner]:
    """Serve ``service`` on ``host:port`` (0: any free port) and start it."""
    # handler_cancellation: a client that goes away cancels its handler (aiohttp >= 3.9
    # leaves it running by default), which releases its queue slot, ticket and zone.
    runner = web.AppRunner(
        service.build_app(),
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_GRACE_S,
        access_log=None,
    )
    await runner.setup()
    try:
        server_ssl = service.tls.server_context() if service.tls is not None else None
        site = web.TCPSite(runner, host, port, ssl_context=server_ssl)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        service.advertise(f"{tls_scheme(server_ssl)}://{bound_host}:{bound_port}")
        await service.start()
        yield runner
    finally:
        # Queued requests are told at once; in-flight ones get the grace period; then
        # the background work stops and the leases are given back.
        service.refuse_waiting()
        await runner.cleanup()
        await service.stop()

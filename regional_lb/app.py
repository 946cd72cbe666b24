"""Wiring and lifecycle of one regional LB replica (:class:`RegionalService`).

The service owns the moving parts and keeps them current; the handlers are
:mod:`regional_lb.api`, admission :mod:`regional_lb.admission`, the fair queue's waiting
room :mod:`regional_lb.dispatch`, the data path :mod:`regional_lb.proxy`.

Background (supervised tasks): the fleet snapshot watcher, the policy watcher (unless
the policy is static), view rebuilds on every snapshot or policy change, capacity-lease
rounds, the region-summary publisher, and queue expiry/dispatch.

Stopping (:func:`serving`): queued requests are answered 503 at once, in-flight ones get
the shutdown grace (:data:`gtm.serve.SHUTDOWN_GRACE_S`), then the background work stops
and the leases and the summary are given back.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from gtm.audit_anchor import AuditAnchorer
from gtm.clock import Clock
from gtm.errors import GtmError
from gtm.geo import GeoLocator
from gtm.models import Endpoint
from gtm.policy_store import ActivePolicy, PolicyWatcher
from gtm.serve import Bound, HttpServer
from gtm.state import keys
from gtm.state.memory import MemoryStore
from gtm.state.publisher import LeasedPublisher
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.store import StateStore
from gtm.tasks import TaskSupervisor
from gtm.tls import TlsMaterial, client_session_options, connector_ssl
from gtm.tracing import OFF, Tracing
from gtm.trust import TierKey
from policies import AuditWriter
from regional_lb.admission import Admission, has_limits
from regional_lb.api import RegionalApi
from regional_lb.config import RegionalSettings
from regional_lb.dispatch import Dispatcher, Waiter
from regional_lb.fairqueue import FairQueue
from regional_lb.leases import CapacityLeases
from regional_lb.location import ClientLocator
from regional_lb.metrics import RegionalMetrics
from regional_lb.priority import DemandMeter
from regional_lb.profiles import profile_source
from regional_lb.proxy import Carrier
from regional_lb.quota import Grant, QuotaLimiter, pool_of
from regional_lb.router import RegionalRouter
from regional_lb.spill import SpillLimiter
from regional_lb.summary import RateMeter, build_summary
from regional_lb.view import RegionalView, ViewBuilder, ZoneAccounting

log = logging.getLogger(__name__)

#: How often the replica asks its GeoIP database whether the file changed; the database
#: itself looks at the file at most once its own interval (``--geoip-reload-interval``).
GEOIP_POLL_INTERVAL_S = 1.0


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
        locator: GeoLocator | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        """``locator``: the GeoIP database and geo map clients are located with (the
        front door's; ``None``: none, so a directly reached replica knows no public
        address and the policy's unknown-location rule decides). ``tracing``: the
        replica's tracer (off by default)."""
        self.settings = settings
        self.tracing = tracing
        #: mTLS: serve only TLS (global/region/ops clients), dial zones and peer regions
        #: with our certificate, never in the clear.
        self.tls = tls
        self._client_ssl = tls.client_context() if tls is not None else None
        self._store = store
        self.clock = clock
        self.registry = registry
        self._static_policy = policy
        self.tasks = TaskSupervisor(registry=registry, clock=clock, component="regional")
        #: Anchors the audit chain's head in the store (gtm.audit_anchor).
        self.anchorer = (
            AuditAnchorer(
                audit,
                store,
                clock=clock,
                registry=registry,
                interval=settings.audit_anchor_interval_s,
            )
            if audit is not None
            else None
        )
        self.snapshots = SnapshotWatcher(
            store, clock=clock, registry=registry, component="regional"
        )
        # A policy given at start (``--policies``) is in force until a policy is applied
        # to the store, which then replaces it — the front door's rule. It was static
        # here, so `gtm policy apply` never reached a replica started with files (as the
        # Kubernetes and systemd examples start them) while it reached the front door.
        self.policies = PolicyWatcher(store, clock=clock, registry=registry, initial=policy)
        self.queue: FairQueue[Waiter] = FairQueue(settings.queue)
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
        self.spill_in = RateMeter()
        self.spill_out = RateMeter()
        self._publisher = LeasedPublisher(
            store,
            keys.region_summary(settings.region),
            ttl_s=3 * settings.summary_interval_s,
            what="region summary",
        )
        self._session: aiohttp.ClientSession | None = None
        self.carrier = Carrier(self._client, self.metrics, settings.proxy)
        self._policy: ActivePolicy | None = None
        self._router: RegionalRouter | None = None
        self._profiles = profile_source(settings.profile_name, metrics=self.metrics.routing)
        self._view = self._builder.build(self.snapshots.current, None, now_wall=clock.wall())
        self._synced = False
        self._advertise = settings.advertise_url
        self.locator = ClientLocator(
            region=settings.region,
            key=TierKey(settings.peer_token) if settings.peer_token else None,
            locator=locator,
            trusted_proxies=settings.trusted_proxies,
            clock=clock,
            registry=registry,
        )
        self.admission = Admission(
            settings,
            policy=lambda: self._policy,
            limiter=self.limiter,
            metrics=self.metrics,
            clock=clock,
            audit=audit,
            spill_in=self.spill_in,
            locator=self.locator,
        )
        self.dispatcher = Dispatcher(
            self.queue,
            router=lambda: self._router,
            view=lambda: self._view,
            accounting=self.accounting,
            metrics=self.metrics,
            clock=clock,
        )
        self.api = RegionalApi(self)

    # ------------------------------------------------------------------ reading

    @property
    def view(self) -> RegionalView:
        return self._view

    @property
    def policy(self) -> ActivePolicy | None:
        return self._policy

    @property
    def router(self) -> RegionalRouter | None:
        return self._router

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

    def build_app(self) -> web.Application:
        return self.api.build_app()

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

    # ------------------------------------------------------------------ lifecycle

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
        tasks.spawn("policy-watch", self.policies.run())
        tasks.spawn("policy-follow", self._follow_policies(self.policies))
        tasks.run_loop(
            "quota-leases", self.leases.refresh, interval=self.settings.leases.refresh_interval
        )
        tasks.run_loop(
            "region-summary", self.publish_summary, interval=self.settings.summary_interval_s
        )
        tasks.run_loop("queue", self.dispatcher.tick, interval=self.settings.queue_tick_s)
        if self.anchorer is not None:
            tasks.spawn("audit-anchor", self.anchorer.run())
        if self.locator.database is not None:
            tasks.run_loop(
                "geoip-reload", self.locator.poll_database, interval=GEOIP_POLL_INTERVAL_S
            )

    def refuse_waiting(self) -> None:
        """Answer every queued request 503 (shutting down): they would not be served."""
        self.dispatcher.refuse_waiting()

    async def stop(self) -> None:
        """Stop background work, refuse what still waits, give leases back."""
        await self.tasks.aclose()
        self.refuse_waiting()
        for name, action in (("leases", self.leases.close), ("summary", self._publisher.withdraw)):
            try:
                await action()
            except GtmError as exc:
                log.warning("could not release %s on shutdown: %s", name, exc)
        if self.anchorer is not None:
            await self.anchorer.close()
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
        # A profile that does not build is logged and counted; the last good one stays.
        self._router = RegionalRouter(
            self._profiles.update(policy),
            settings=self.settings.router,
            limiter=self._spill_limiter,
            demand=self._demand,
        )
        now = self.clock.monotonic()
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
            now_wall=self.clock.wall(),
            stale=self.snapshots.stale,
        )
        self.accounting.observe(self._view.zones)
        self.dispatcher.dispatch()

    async def publish_summary(self) -> None:
        now = self.clock.monotonic()
        url = self._advertise
        summary = build_summary(
            self._view,
            self.accounting,
            published_at=self.clock.wall(),
            spill_in_per_s=self.spill_in.rate(now),
            spill_out_per_s=self.spill_out.rate(now),
            endpoints=(Endpoint(url=url),) if url else (),
        )
        await self._publisher.publish(summary)


@contextlib.asynccontextmanager
async def serving(service: RegionalService, host: str, port: int) -> AsyncIterator[Bound]:
    """Serve ``service`` on ``host:port`` (0: any free port) and start it."""
    server_ssl = service.tls.server_context() if service.tls is not None else None
    server = HttpServer(service.build_app(), host, port, ssl_context=server_ssl)
    try:
        bound = await server.start()
        service.advertise(bound.url)
        await service.start()
        yield bound
    finally:
        # Queued requests are told at once; in-flight ones get the grace period; then
        # the background work stops and the leases are given back.
        service.refuse_waiting()
        await server.stop()
        await service.stop()


__all__ = ["RegionalService", "RegionalSettings", "serving"]

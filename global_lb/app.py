"""Wiring: configuration → state, policies, geo, health, view, DNS and HTTP servers.

:class:`GlobalTier` is the whole global tier in one process (``gtm global``; ``gtm up``
embeds it). Its moving parts run as supervised tasks:

* the fleet snapshot watcher (regions, region summaries, drains from the store);
* the policy watcher (hot reload; the files given with ``--policies`` — or the
  examples — are in force until a generation is applied to the store);
* the active health checks of every region's regional LB;
* followers that rebuild the view when the snapshot or the policy moves (health
  changes rebuild it directly), so DNS answers and HTTP decisions change within one
  health round of a regional LB dying.
"""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from global_lb import profiles
from global_lb.api import FrontDoor
from global_lb.audit import AuditSink, AuditWriter, MemoryAudit
from global_lb.config import GlobalConfig
from global_lb.dns.responder import Responder
from global_lb.dns.server import BoundAddress, DnsServer, parse_listen
from global_lb.dns.workers import DnsWorkers
from global_lb.geo import (
    ChainLocator,
    CidrMap,
    GeoLocator,
    ReloadingDatabase,
    ReloadOutcome,
    load_geo_map,
    open_locator,
)
from global_lb.health import (
    HealthChecker,
    HealthTable,
    HttpProber,
    Prober,
    ProbeResult,
)
from global_lb.keeper import ViewKeeper, load_topology
from global_lb.metrics import GlobalMetrics
from global_lb.router import GlobalRouter
from global_lb.view import LatencyModel
from gtm.audit_anchor import AuditAnchorer
from gtm.clock import Clock
from gtm.errors import ConfigError, StateUnavailable
from gtm.outage import OutageLog
from gtm.policy_store import ActivePolicy, PolicyWatcher, activate
from gtm.routing import RoutingMetrics
from gtm.serve import HttpServer, settle_collector
from gtm.state.memory import MemoryStore
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.store import StateStore
from gtm.state.url import open_store
from gtm.tasks import Backoff, TaskSupervisor
from gtm.tls import TlsMaterial, client_session_options, connector_ssl
from gtm.tracing import OFF, Tracing
from policies import PolicyError, load_examples, load_paths

log = logging.getLogger(__name__)


def load_policy(paths: Sequence[str]) -> ActivePolicy:
    """The policy set from files (or the examples), as generation 0."""
    try:
        policy_set = load_paths(list(paths)) if paths else load_examples()
    except PolicyError as exc:
        raise ConfigError(f"policies: {exc}") from None
    return activate(0, policy_set)


@dataclass(frozen=True, slots=True)
class Endpoints:
    dns: BoundAddress | None
    http: str | None


class GlobalTier:
    """The global tier's services; ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        config: GlobalConfig,
        *,
        clock: Clock,
        registry: CollectorRegistry,
        store: StateStore | None = None,
        locator: GeoLocator | None = None,
        prober: Prober | None = None,
        audit: AuditSink | None = None,
        policy: ActivePolicy | None = None,
        tls: TlsMaterial | None = None,
        front_door_tls: bool = False,
        tracing: Tracing = OFF,
    ) -> None:
        self.config = config
        #: mTLS to the regional LBs (health checks and proxied requests, never in the
        #: clear); the front door serves TLS (no client certificates) only when
        #: ``front_door_tls``: its clients are end users.
        self.tls = tls
        self.front_door_tls = front_door_tls and tls is not None
        self._clock = clock
        self._registry = registry
        self.metrics = GlobalMetrics(registry)
        self._store = store or open_store(config.state, clock=clock, registry=registry)
        self._owns_store = store is None
        initial = policy or load_policy(config.policies)
        #: Started with neither a policy nor files, on a store other tiers share: the
        #: examples (whose demo API keys are public) only stand in until :meth:`start`
        #: has the store's policy in force, and it does not serve without one.
        self._policy_from_store = (
            policy is None and not config.policies and not isinstance(self._store, MemoryStore)
        )
        self.locator = locator or _locator(config, clock)
        #: The --geoip-db followed for new versions (None: a fixed database).
        self.geo_database = _following(self.locator)
        self._audit_writer: AuditWriter | None = None
        self.audit = audit or self._open_audit()
        #: Anchors the audit chain's head in the store (gtm.audit_anchor).
        self.anchorer = (
            AuditAnchorer(
                self._audit_writer,
                self._store,
                clock=clock,
                registry=registry,
                interval=config.audit_anchor_interval_s,
            )
            if self._audit_writer is not None
            else None
        )
        self._supervisor = TaskSupervisor(registry=registry, clock=clock, component="global")
        self.snapshots = SnapshotWatcher(
            self._store, clock=clock, registry=registry, component="global"
        )
        self.policies = PolicyWatcher(self._store, clock=clock, registry=registry, initial=initial)
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None
        self._prober = prober
        self.health = HealthChecker(
            _LazyProber(self),
            clock=clock,
            metrics=self.metrics,
            config=config.health,
            on_change=self._health_changed,
        )
        topology = load_topology(config.topology) if config.topology else ()
        self.keeper = ViewKeeper(
            policy=lambda: self.policies.current,
            snapshot=lambda: self.snapshots.current,
            health=lambda: self.health.table,
            metrics=self.metrics,
            topology=topology,
            latency=LatencyModel(),
            require_summaries=config.require_summaries,
            stale=lambda: self.snapshots.stale and self.snapshots.current.revision > 0,
            on_regions=self.health.set_targets,
        )
        # Both follow the policy in force: a hot-reloaded routing profile is swapped in
        # when the first view built on it is decided over.
        self.router, self.dns_router = build_routers(initial, config, RoutingMetrics(registry))
        self.responder = Responder(
            config.zone,
            view=lambda: self.keeper.view,
            router=self.dns_router,
            locator=self.locator,
            metrics=self.metrics,
            clock=clock,
            rrl=config.rrl,
        )
        self.front_door = FrontDoor(
            config=config.front_door,
            view=lambda: self.keeper.view,
            router=self.router,
            locator=self.locator,
            metrics=self.metrics,
            registry=registry,
            audit=self.audit,
            clock=clock,
            session=self._client_session,
            ready=lambda: self.health.ready,
            tracing=tracing,
        )
        self._dns: DnsServer | None = None
        self.dns_pool: DnsWorkers | None = None
        self._http: HttpServer | None = None
        self.endpoints = Endpoints(None, None)

    def _health_changed(self, _table: HealthTable) -> None:
        self.keeper.refresh()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Endpoints:
        client_ssl = self.tls.client_context() if self.tls is not None else None
        self._session = aiohttp.ClientSession(
            auto_decompress=False,  # relayed bytes are the regional LB's own
            connector=aiohttp.TCPConnector(
                limit=1024, ttl_dns_cache=30, ssl=connector_ssl(client_ssl)
            ),
            **client_session_options(client_ssl),
        )
        # Health probes get a session of their own. aiohttp reuses the oldest idle
        # connection first, so a probe every ``interval`` on the relay's session touched
        # each of its idle connections in turn and none ever reached its keep-alive
        # timeout: the connections a load peak opened to a region stayed open for good
        # (the soak's descriptors not back after the load). Apart, the probes keep one
        # connection per region and the relay's idle ones close.
        self._probe_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=connector_ssl(client_ssl)),
            **client_session_options(client_ssl),
        )
        try:
            if self.tls is not None:
                self._supervisor.spawn("tls-reload", self.tls.run())
            if self._policy_from_store:
                await self._load_stored_policy()
            self.keeper.refresh()
            self._supervisor.spawn("snapshots", self.snapshots.run())
            self._supervisor.spawn("policies", self.policies.run())
            self._supervisor.spawn("health", self.health.run())
            self._supervisor.spawn("follow-snapshots", self._follow_snapshots())
            self._supervisor.spawn("follow-policies", self._follow_policies())
            self._supervisor.run_loop("refresh", self._refresh, interval=1.0)
            if self.anchorer is not None:
                self._supervisor.spawn("audit-anchor", self.anchorer.run())
            dns = await self._start_dns()
            http = await self._start_http()
        except BaseException:
            await self.stop()
            raise
        # Start-up objects live for the process: keep the cyclic GC from walking them on
        # every full collection, and young collections out of most decisions
        # (gtm.serve.settle_collector).
        settle_collector()
        self.endpoints = Endpoints(dns, http)
        return self.endpoints

    async def stop(self) -> None:
        await self._supervisor.aclose()
        if self.dns_pool is not None:
            await self.dns_pool.stop()
            self.dns_pool = None
        if self._dns is not None:
            await self._dns.stop()
            self._dns = None
        if self._http is not None:
            await self._http.stop()
            self._http = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._probe_session is not None:
            await self._probe_session.close()
            self._probe_session = None
        if self.anchorer is not None:
            await self.anchorer.close()
            self.anchorer = None
        if self._owns_store:
            await self._store.aclose()
        if self._audit_writer is not None:
            self._audit_writer.close()
            self._audit_writer = None

    async def _start_dns(self) -> BoundAddress | None:
        if self.config.dns_listen is None:
            return None
        host, port = parse_listen(self.config.dns_listen, 53)
        workers = self.config.dns_workers
        reuse_port = self.config.reuse_port or workers > 1
        self._dns = DnsServer(self.responder, host, port, reuse_port=reuse_port)
        bound = await self._dns.start()
        if workers > 1:
            only_dns = {"http_listen": None, "dns_workers": 1, "audit_dir": None}
            child = self.config.model_copy(
                update={**only_dns, "dns_listen": str(bound), "reuse_port": True}
            )
            self.dns_pool = DnsWorkers(
                child,
                workers - 1,
                metrics=self.metrics,
                registry=self._registry,
                clock=self._clock,
                supervisor=self._supervisor,
            )
            await self.dns_pool.start()
        return bound

    async def _start_http(self) -> str | None:
        if self.config.http_listen is None:
            return None
        host, port = parse_listen(self.config.http_listen, 8080)
        self._http = HttpServer(
            self.front_door.app(),
            host,
            port,
            ssl_context=self.front_door_ssl(),
            reuse_port=self.config.reuse_port,
        )
        return (await self._http.start()).url

    def front_door_ssl(self) -> ssl.SSLContext | None:
        """The front door's server context (TLS without client certificates), or None."""
        if self.tls is None or not self.front_door_tls:
            return None
        return self.tls.server_context(client_certs=False)

    def _client_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the global tier is not started")
        return self._session

    def _open_audit(self) -> AuditSink:
        if self.config.audit_dir is None:
            log.warning(
                "audit: no --audit-dir; residency decisions are recorded in memory only "
                "(give a directory to keep a verifiable trail: gtm audit verify DIR)"
            )
            return MemoryAudit()
        self._audit_writer = AuditWriter(Path(self.config.audit_dir), prefix="global")
        return self._audit_writer

    # ------------------------------------------------------------------ followers

    async def _follow_snapshots(self) -> None:
        while True:
            seen = self.snapshots.current.revision
            await self.snapshots.wait_for_revision(seen + 1)
            self.keeper.refresh()

    async def _load_stored_policy(self) -> None:
        """The store's policy generation in force before anything is served: waits out
        an unreachable store (logged once, retried with backoff); a store without a
        policy is a :class:`ConfigError` saying how to give one."""
        outage = OutageLog(
            "policy load before serving",
            logger=log,
            clock=self._clock,
            consequence="not serving until the store answers",
        )
        rng = random.Random()
        while True:
            try:
                loaded = await self.policies.reload()
            except StateUnavailable as exc:
                outage.failed(exc)
                await self._clock.sleep(Backoff().delay(outage.attempts - 1, rng))
                continue
            outage.recovered()
            if loaded:
                return
            raise ConfigError(
                "no policy in the state store: apply one first (`gtm policy apply DIR "
                "--state URL`) or give the tier its files (--policies DIR)"
            )

    async def _follow_policies(self) -> None:
        while True:
            current = self.policies.current
            await self.policies.wait_for_generation((current.generation if current else 0) + 1)
            self.keeper.refresh()

    async def _refresh(self) -> None:
        self.keeper.refresh()
        self.responder.flush_counts()  # DNS answers on the fast path, counted in batches
        self.poll_geo()

    def poll_geo(self) -> ReloadOutcome | None:
        """Look for a new GeoIP database (at most once its interval); after a reload,
        forget every location found with the old one: the front door's client cache,
        the DNS responder's client and whole-response caches."""
        if self.geo_database is None:
            return None
        outcome = self.geo_database.poll()
        if outcome is None:
            return None
        self.metrics.geoip_reloads.labels(outcome.value).inc()
        if outcome is ReloadOutcome.RELOADED:
            self.front_door.forget_locations()
            self.responder.forget_locations()
        return outcome


class _LazyProber:
    """The injected prober, or HTTP probes over the tier's probe session once it
    exists (not the relay's: see :meth:`GlobalTier.start`)."""

    def __init__(self, tier: GlobalTier) -> None:
        self._tier = tier

    async def probe(self, url: str, /) -> ProbeResult:
        tier = self._tier
        if tier._prober is not None:
            return await tier._prober.probe(url)
        session = tier._probe_session
        if session is None:
            raise RuntimeError("the global tier is not started")
        return await HttpProber(session, tier.config.health).probe(url)


def build_routers(
    policy: ActivePolicy, config: GlobalConfig, metrics: RoutingMetrics | None
) -> tuple[GlobalRouter, GlobalRouter]:
    """The request router (cached decisions) and the DNS router (the responder caches),
    each following the routing profile of the policy in force (``--profile`` and
    :data:`~global_lb.profiles.DNS_PROFILE_NAME`, else the built-in defaults)."""
    request = profiles.follow(config.profile, profiles.request_default(config.profile), metrics)
    dns = profiles.follow(profiles.DNS_PROFILE_NAME, profiles.DEFAULT_DNS_PROFILE, metrics)
    return (
        GlobalRouter(*request(policy), cache_size=config.decision_cache, follow=request),
        GlobalRouter(*dns(policy), cache_size=0, follow=dns),
    )


def _locator(config: GlobalConfig, clock: Clock) -> GeoLocator:
    cidr: CidrMap | None = load_geo_map(config.geo_map) if config.geo_map else None
    interval = config.geoip_reload_interval_s
    reload = (clock, interval) if interval > 0 else None
    return open_locator(config.geoip_db, cidr, config.unknown_location, reload=reload)


def _following(locator: GeoLocator) -> ReloadingDatabase | None:
    if isinstance(locator, ChainLocator) and isinstance(locator.database, ReloadingDatabase):
        return locator.database
    return None


__all__ = ["Endpoints", "GlobalConfig", "GlobalTier", "load_policy"]

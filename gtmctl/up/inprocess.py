"""The default ``gtm up``: every tier and every emulated GPU in one asyncio loop.

Start order follows the data: GPU workers register (under leases) in the store, zone
agents discover them and publish zone summaries, regional LBs publish region summaries,
and the global tier routes on those. Each regional LB and zone agent listens on its
region's own loopback address, so the addresses in DNS answers are usable as they are.
Stopping goes the other way round, each part given its grace period, so no request is
cut mid-stream by a tier below it going first.

Every component has its own Prometheus registry (their metric names would collide in
one) and serves it on its own ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from global_lb.app import GlobalConfig, GlobalTier
from global_lb.config import FrontDoorConfig
from global_lb.dns.zone import ZoneConfig as DnsZoneConfig
from global_lb.health import HealthCheckConfig
from gpusim.auth import WorkerAuth, WorkerAuthConfig
from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.clock import Clock
from gtm.errors import ConfigError
from gtm.geo import GeoLocator, load_geo_map, open_locator
from gtm.metrics import new_registry
from gtm.policy_store import activate
from gtm.serve import HttpServer
from gtm.state.memory import MemoryStore
from gtm.state.store import StateStore
from gtm.state.url import open_store
from gtm.tasks import TaskSupervisor
from gtm.tls import TlsMaterial
from gtm.topology import GpuPlacement, RegionPlacement, ZonePlacement
from gtmctl.up.config import LOCAL_PROXIES, HostPort
from gtmctl.up.fleet import DNS_ZONE, Plan, Started, seed_store, unseed_store
from gtmctl.up.tls import GLOBAL_IDENTITY, LocalTls, https, moved_urls, tls_directory
from policies import AuditWriter
from regional_lb.app import RegionalService, RegionalSettings, serving
from regional_lb.router import RouterSettings
from regional_lb.spill import NO_SPILL
from zone_agent.app import ZoneAgent
from zone_agent.config import ZoneConfig
from zone_agent.credentials import WorkerKeyConfig

log = logging.getLogger(__name__)

#: Health checks of the regional LBs, looser than a production default: every tier
#: shares one event loop here, and a loop busy with a burst of streamed tokens must not
#: make a healthy region flap (2 s timeout, 3 misses to mark it down).
LOCAL_HEALTH = HealthCheckConfig(interval=1.0, timeout=2.0, rise=1, fall=3)

AppHook = Callable[[web.Application], None]


def global_config(plan: Plan, *, http_listen: str | None) -> GlobalConfig:
    """The global tier's configuration in a local deployment (shared with --processes)."""
    config = plan.config
    tiers = config.tiers
    return GlobalConfig(
        dns_listen=config.dns_listen,
        http_listen=http_listen,
        state=config.state,
        policies=config.policies,
        geoip_db=config.geoip_db,
        geo_map=str(plan.geo_map_path),
        audit_dir=str(plan.run_dir / "audit" / "global"),
        zone=config.dns_zone or DnsZoneConfig(zone=DNS_ZONE),
        health=LOCAL_HEALTH,
        front_door=FrontDoorConfig(
            trusted_proxies=LOCAL_PROXIES,
            peer_token=SecretStr(plan.tier_key),
            affinity=tiers.affinity,
        ),
        profile=tiers.global_profile,
        require_summaries=True,
    )


def _api_keys(plan: Plan) -> tuple[SecretStr, ...]:
    """The emulated workers' keys: ``--worker-api-key-file``'s, or none."""
    key = plan.worker_key
    return () if key is None else (SecretStr(key.secret()),)


def zone_config(plan: Plan, zone: ZonePlacement) -> ZoneConfig:
    """A zone agent's configuration in a local deployment."""
    config = plan.config
    return ZoneConfig(
        zone=zone.id,
        region=zone.region,
        host=zone.host,
        port=zone.port,
        scrape_interval_s=config.scrape_interval_s,
        profile=config.tiers.zone_profile,
        affinity=config.tiers.affinity,
        worker_keys=WorkerKeyConfig(
            file=None if config.worker_api_key_file is None else Path(config.worker_api_key_file)
        ),
        gpu_profiles=tuple(Path(p) for p in config.gpu_profiles),
    )


def regional_settings(plan: Plan, region: RegionPlacement, advertise: str) -> RegionalSettings:
    """A regional LB's configuration in a local deployment."""
    tiers = plan.config.tiers
    return RegionalSettings(
        region=region.id,
        replica_id=f"{region.id}-1",
        advertise_url=advertise,
        # Clients that come straight here are located as the front door locates
        # them: its key, its trusted proxies, its GeoIP database and geo map.
        peer_token=plan.tier_key,
        trusted_proxies=LOCAL_PROXIES,
        affinity=tiers.affinity,
        router=RouterSettings() if tiers.spill else RouterSettings(spill=NO_SPILL),
    )


class InProcessFleet:
    """The whole deployment in this process: ``await start()``, then ``await stop()``."""

    def __init__(self, plan: Plan, *, clock: Clock, app_hook: AppHook | None = None) -> None:
        self.plan = plan
        self._clock = clock
        self._app_hook = app_hook
        self._stack = contextlib.AsyncExitStack()
        self._registry = new_registry()
        self._supervisor = TaskSupervisor(registry=self._registry, clock=clock, component="up")
        self._store: StateStore = open_store(
            plan.config.state, clock=clock, registry=self._registry
        )
        self.gpus: dict[str, GpuSimServer] = {}
        self.zones: dict[str, ZoneAgent] = {}
        self.regions: dict[str, RegionalService] = {}
        self._geo: GeoLocator | None = None
        self.global_tier: GlobalTier | None = None
        tls_dir = tls_directory(plan.config)
        self.tls = LocalTls.prepare(plan.deployment, tls_dir) if tls_dir is not None else None

    def _tls(self, identity: str, tier: str, registry: CollectorRegistry) -> TlsMaterial | None:
        if self.tls is None:
            return None
        return self.tls.material(identity, tier, clock=self._clock, registry=registry)

    @property
    def store(self) -> StateStore:
        return self._store

    async def start(self) -> Started:
        """Start everything; on any failure, stop what started and re-raise."""
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> Started:
        plan = self.plan
        self._stack.push_async_callback(self._store.aclose)
        if isinstance(self._store, MemoryStore):
            self._store.run_expiry(self._supervisor)
        self._stack.push_async_callback(self._supervisor.aclose)
        generation = await seed_store(
            self._store, plan, self._clock, urls=moved_urls(plan.deployment, self.tls)
        )
        self._stack.push_async_callback(unseed_store, self._store, plan)
        log.info("policies applied as generation %d", generation)
        await asyncio.gather(*(self._start_gpu(g) for g in plan.deployment.gpus))
        await asyncio.gather(*(self._start_zone(z) for z in plan.deployment.zones))
        for region in plan.deployment.regions:
            await self._start_region(region)
        http = await self._start_global()
        return Started(
            dns=self._dns_bound(),
            http=http,
            status_url=f"{http.url}/status",
            state=plan.config.state,
        )

    def mark_ready(self) -> None:
        """Nothing to do: the in-process deployment has no control API."""

    async def stop(self) -> None:
        await self._stack.aclose()

    # ------------------------------------------------------------------ tiers

    async def _start_gpu(self, gpu: GpuPlacement) -> None:
        config = GpuSimConfig(
            host=gpu.host,
            port=0,
            gpu_type=gpu.gpu_type,
            models=gpu.models,
            speedup=self.plan.config.speedup,
            seed=gpu.seed,
            region=gpu.region,
            zone=gpu.zone,
            worker_id=gpu.id,
        )
        registry = new_registry()
        server = GpuSimServer(
            config,
            registry=registry,
            clock=self._clock,
            store=self._store,
            tls=self._tls(f"gpu/{gpu.id}", "gpu", registry),
            auth=WorkerAuth(WorkerAuthConfig(api_keys=_api_keys(self.plan))),
        )
        await server.start()
        self._stack.push_async_callback(server.stop)
        self.gpus[gpu.id] = server

    async def _start_zone(self, zone: ZonePlacement) -> None:
        config = zone_config(self.plan, zone)
        registry = new_registry()
        agent = ZoneAgent(
            config,
            registry=registry,
            clock=self._clock,
            store=self._store,
            tls=self._tls(f"zone/{zone.id}", "zone", registry),
        )
        try:
            await agent.start()
        except OSError as exc:
            await agent.stop()
            raise ConfigError(
                f"zone agent {zone.id} cannot listen on {zone.host}:{zone.port}: {exc.strerror}"
            ) from None
        self._stack.push_async_callback(agent.stop)
        self.zones[zone.id] = agent

    async def _start_region(self, region: RegionPlacement) -> None:
        advertise = https(region.url) if self.tls is not None else region.url
        settings = regional_settings(self.plan, region, advertise)
        # One audit directory per writer: a writer locks its directory.
        audit = AuditWriter(
            self.plan.run_dir / "audit" / f"regional-{region.id}", prefix="regional"
        )
        self._stack.callback(audit.close)
        registry = new_registry()
        service = RegionalService(
            settings,
            store=self._store,
            clock=self._clock,
            registry=registry,
            audit=audit,
            tls=self._tls(f"region/{region.id}", "regional", registry),
            locator=self._locator(),
        )
        try:
            await self._stack.enter_async_context(serving(service, region.host, region.port))
        except OSError as exc:
            raise ConfigError(
                f"regional LB {region.id} cannot listen on {region.host}:{region.port}: "
                f"{exc.strerror}"
            ) from None
        self.regions[region.id] = service

    def _locator(self) -> GeoLocator:
        """The front door's locator (one, shared by the regional LBs of this process)."""
        if self._geo is None:
            config = self.plan.config
            cidr = load_geo_map(self.plan.geo_map_path)
            self._geo = open_locator(config.geoip_db, cidr)
        return self._geo

    async def _start_global(self) -> HostPort:
        plan = self.plan
        registry = new_registry()
        tier = GlobalTier(
            global_config(plan, http_listen=None),
            clock=self._clock,
            registry=registry,
            store=self._store,
            policy=activate(0, plan.policy_set),
            tls=self._tls(GLOBAL_IDENTITY, "global", registry),
        )
        self.global_tier = tier
        await tier.start()
        self._stack.push_async_callback(tier.stop)
        # The front door's app, served here so that the status page can share its port
        # (the global tier has no hook to add routes to the app it serves itself).
        app = tier.front_door.app()
        if self._app_hook is not None:
            self._app_hook(app)
        server = HttpServer(app, plan.http.host, plan.http.port)
        bound = await server.start()
        self._stack.push_async_callback(server.stop)
        return HostPort(bound.host, bound.port)

    def _dns_bound(self) -> HostPort:
        assert self.global_tier is not None
        bound = self.global_tier.endpoints.dns
        if bound is None:
            return self.plan.dns
        return HostPort(str(bound.host), int(bound.port))

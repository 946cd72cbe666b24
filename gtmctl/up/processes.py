"""``gtm up --processes``: every tier and every emulated GPU its own OS process, sharing
one etcd — a real multi-process deployment on one machine.

The children are the ordinary commands (``gtm gpu-sim``, ``gtm zone``, ``gtm regional``,
``gtm global``), run with this interpreter (``python -m gtmctl``), each logging to its
own file in the run directory. ``gtm up`` supervises them:

* a child that exits while the deployment runs is restarted (after a backoff), so a
  ``kill`` of a regional LB is a failover drill, not the end of the demo;
* each child is in a session of its own, so a Ctrl-C in the terminal reaches only
  ``gtm up``, which stops the tiers top down (global, regional, zone, GPU: SIGTERM,
  then SIGKILL after a grace period); on Linux each child also gets
  ``PR_SET_PDEATHSIG``, so even a ``kill -9`` of ``gtm up`` leaves no orphans.

Without ``--state etcd://…``, ``gtm up`` starts a private etcd in the run directory
(:class:`gtm.state.etcd_cluster.EtcdCluster`: one member, or three with
``--etcd-members 3``), restarts a member that dies (with backoff, as it restarts its
children; one warning when the outage starts, one line when the member is back, counted
in ``gtm_up_etcd_restarts_total`` and the control API's ``restarts``) and stops it last.

For chaos drills (:mod:`gtmctl.up.control`): the status listener also serves a control API
(the deployment's addresses and pids; hold a child down; kill and start etcd members),
and ``--chaos-links`` routes chosen inter-tier connections through fault-proxy links
served by a ``gtm chaos proxy`` child (Toxiproxy API): global → each regional LB
(the region record's URL points at the link; DNS answers keep the region's address),
regional → each zone agent (the zone record's URL), and each tier → each etcd member
(the child's ``--state`` lists its links). A toxic on a link is then a fault between
exactly those two tiers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import Counter

from global_lb.dns.options import zone_flags
from gtm.admin_auth import AdminGuard
from gtm.clock import Clock
from gtm.credentials import VLLM_API_KEY_ENV as API_KEY_ENV
from gtm.errors import ConfigError, GtmError, StateError
from gtm.http_limits import HttpLimits, limited_app
from gtm.logs import configured_format
from gtm.metrics import new_registry
from gtm.models import GpuWorker
from gtm.net import free_port
from gtm.serve import HttpServer
from gtm.state import codec, keys
from gtm.state.etcd_cluster import EtcdCluster
from gtm.state.store import StateStore
from gtm.state.url import open_store, parse_state_url
from gtm.tasks import Backoff, TaskSupervisor
from gtm.topology import GpuPlacement, RegionPlacement, ZonePlacement
from gtm.trust import TIER_KEY_ENV
from gtmctl.up.config import LOCAL_PROXIES, HostPort
from gtmctl.up.control import (
    ChildInfo,
    ControlApi,
    DeploymentDocument,
    EtcdMemberInfo,
    GpuInfo,
    LinkInfo,
    LinkKind,
    RegionInfo,
    ZoneInfo,
    link_name,
)
from gtmctl.up.fleet import Plan, Started, seed_store, unseed_store
from gtmctl.up.policy_profile import TierPolicy
from gtmctl.up.tls import GLOBAL_IDENTITY, LocalTls, https, moved_urls, tls_directory

log = logging.getLogger(__name__)

#: How long a tier gets to stop after SIGTERM before SIGKILL, s (the regional LB's own
#: grace for in-flight requests is 5 s).
STOP_GRACE_S = 8.0
#: Restart backoff of a child that died (full jitter, capped).
RESTART_BACKOFF = Backoff(initial=0.5, maximum=10.0)
#: How often the private etcd's members are checked for one that died, s.
ETCD_CHECK_S = 0.5
#: Variables an emulated GPU would take its API key from (``gtm gpu-sim --api-key``).
_WORKER_KEY_VARIABLES = frozenset({API_KEY_ENV, "GTM_API_KEY"})
#: Linux prctl option: signal sent to a child when its parent dies.
_PR_SET_PDEATHSIG = 1
#: ``gtm up --kv-events``: the topic the GPUs publish and the zones read.
KV_EVENTS_TOPIC = "kv-events"
#: The longest Unix socket path (``sun_path`` less its NUL on Linux).
_IPC_PATH_MAX = 107

AppHook = Callable[[web.Application], None]


class TierKind(StrEnum):
    GPU = "gpu-sim"
    ZONE = "zone"
    REGIONAL = "regional"
    GLOBAL = "global"
    CHAOS_PROXY = "chaos-proxy"


#: Stop order: the entry points first, so nothing sends work to a stopped tier below;
#: the fault proxy last, as the tiers' connections run through it.
STOP_ORDER = (
    TierKind.GLOBAL,
    TierKind.REGIONAL,
    TierKind.ZONE,
    TierKind.GPU,
    TierKind.CHAOS_PROXY,
)
#: How long the fault proxy may take to answer its API after it is started, s.
CHAOS_PROXY_START_S = 20.0


@dataclass(slots=True)
class Child:
    """One supervised process."""

    name: str
    kind: TierKind
    argv: list[str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    exited: list[int] = field(default_factory=list)
    #: Held down (control API): not restarted when it exits, until released.
    held: bool = False
    released: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def control_name(self) -> str:
        """``global``, ``chaos-proxy``, or ``regional/<id>``, ``zone/<id>``, ``gpu/<id>``."""
        if self.kind in (TierKind.GLOBAL, TierKind.CHAOS_PROXY):
            return self.name
        return f"{'gpu' if self.kind is TierKind.GPU else self.kind.value}/{self.name}"

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.returncode is None else None

    def info(self) -> ChildInfo:
        return ChildInfo(
            name=self.control_name,
            kind=self.kind.value,
            pid=self.pid,
            held=self.held,
            restarts=self.restarts,
        )


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the child, before exec: get SIGTERM when the parent dies (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def _start_etcd(cluster: EtcdCluster) -> GtmError | None:
    """Start ``cluster`` (its members start in threads); its failure is returned (the
    caller raises it), so the supervisor does not log it a second time as a crash."""
    try:
        await cluster.start_all()
    except GtmError as exc:
        return exc
    return None


async def _restart_member(cluster: EtcdCluster, name: str) -> GtmError | None:
    """Start one member again; its failure is returned, as :func:`_start_etcd`'s."""
    try:
        await cluster.restart(name)
    except GtmError as exc:
        return exc
    return None


def _fixed(address: HostPort, *, avoid: Collection[int] = ()) -> HostPort:
    """``address``, or with a free port when it has none (none of ``avoid``: chosen
    already, not bound yet)."""
    if address.port:
        return address
    return HostPort(address.host, free_port(address.host, avoid=avoid))


def _gtm(*args: str) -> list[str]:
    """``gtm ARGS`` with this interpreter, logging at INFO in this process's format."""
    logging_args = ("--log-level", "info", "--log-format", configured_format().value)
    return [sys.executable, "-m", "gtmctl", *logging_args, *args]


def kv_events_config(gpu: GpuPlacement, directory: Path) -> str:
    """``gtm up --kv-events``: the GPU's ``--kv-events-config``, its PUB and replay
    sockets ipc:// paths of its own in ``directory`` (vLLM binds an ipc:// endpoint, as
    its ``tcp://*`` default, but connects out of a ``tcp://127.0.0.1:PORT`` one; a path
    is never taken by another process, nor reachable off the machine). The GPU registers
    them as its ``kv-events`` labels, which the zone agent dials."""
    pub, replay = directory / f"{gpu.id}.pub", directory / f"{gpu.id}.replay"
    if len(str(replay)) > _IPC_PATH_MAX:
        raise ConfigError(
            f"--kv-events: the socket path {replay} is longer than a Unix socket's "
            f"{_IPC_PATH_MAX} bytes; give a shorter --run-dir"
        )
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{pub}",
        "replay_endpoint": f"ipc://{replay}",
        "topic": KV_EVENTS_TOPIC,
    }
    return json.dumps(config)


def gpu_argv(
    gpu: GpuPlacement, state: str, speedup: float, *, kv_events_dir: Path | None = None
) -> list[str]:
    models = [arg for m in gpu.models for arg in ("--model", m)]
    events = (
        ()
        if kv_events_dir is None
        else ("--kv-events-config", kv_events_config(gpu, kv_events_dir))
    )
    return _gtm(
        "gpu-sim",
        *("--host", gpu.host, "--port", "0", "--gpu-type", gpu.gpu_type, *models),
        *("--speedup", repr(speedup), "--seed", str(gpu.seed), "--state", state),
        *("--region", gpu.region, "--zone", gpu.zone, "--worker-id", gpu.id),
        *events,
    )


def zone_argv(
    zone: ZonePlacement,
    state: str,
    scrape_interval_s: float,
    tiers: TierPolicy | None = None,
    *,
    worker_key_file: str | None = None,
    gpu_profiles: tuple[str, ...] = (),
    kv_events: bool = False,
) -> list[str]:
    keyed = ("--worker-api-key-file", worker_key_file) if worker_key_file else ()
    profiled = [arg for path in gpu_profiles for arg in ("--gpu-profiles", path)]
    # The GPUs' kv-events labels name their sockets (the pattern is then never used).
    events = ("--kv-events-topic", KV_EVENTS_TOPIC, "--kv-events") if kv_events else ()
    return _gtm(
        "zone",
        *("--zone", zone.id, "--region", zone.region, "--state", state),
        *("--listen", f"{zone.host}:{zone.port}", "--scrape-interval", repr(scrape_interval_s)),
        *(tiers or TierPolicy()).zone_flags(),
        *keyed,
        *profiled,
        *events,
    )


def regional_argv(
    region: RegionPlacement,
    state: str,
    audit_root: Path,
    *,
    advertise: str | None = None,
    plan: Plan | None = None,
) -> list[str]:
    # One audit directory per writer: a writer locks its directory. Clients that come
    # straight to a region are located as the front door locates them (its GeoIP
    # database, geo map and trusted proxies); the tiers' key comes in the environment.
    located: list[str] = []
    if plan is not None:
        geoip = plan.config.geoip_db
        located += ["--geoip-db", geoip] if geoip else []
        located += ["--geo-map", str(plan.geo_map_path)]
        located += [arg for n in LOCAL_PROXIES for arg in ("--trusted-proxy", str(n))]
        located += plan.config.tiers.regional_flags()
    return _gtm(
        "regional",
        *("--region", region.id, "--state", state, "--listen", f"{region.host}:{region.port}"),
        *("--replica-id", f"{region.id}-1", "--advertise-url", advertise or region.url),
        *("--audit-dir", str(audit_root / f"regional-{region.id}")),
        *located,
    )


def global_argv(plan: Plan, state: str, dns: HostPort, http: HostPort) -> list[str]:
    config = plan.config
    policies = [arg for p in config.policies for arg in ("--policies", p)]
    geoip = ["--geoip-db", config.geoip_db] if config.geoip_db else []
    trusted = [arg for n in LOCAL_PROXIES for arg in ("--trusted-proxy", str(n))]
    return _gtm(
        "global",
        *("--dns-listen", str(dns), "--http-listen", str(http), "--state", state),
        *policies,
        *geoip,
        *(
            "--geo-map",
            str(plan.geo_map_path),
            "--audit-dir",
            str(plan.run_dir / "audit" / "global"),
        ),
        *trusted,
        "--require-summaries",
        *config.tiers.global_flags(),
        *(zone_flags(config.dns_zone) if config.dns_zone is not None else ()),
    )


class ProcessFleet:
    """The deployment as supervised child processes: ``start()``, then ``stop()``."""

    def __init__(
        self,
        plan: Plan,
        *,
        clock: Clock,
        app_hook: AppHook | None = None,
        guard: AdminGuard | None = None,
    ) -> None:
        self.plan = plan
        self._guard = guard
        self._clock = clock
        self._app_hook = app_hook
        self._registry = new_registry()
        self._supervisor = TaskSupervisor(registry=self._registry, clock=clock, component="up")
        self._etcd: EtcdCluster | None = None
        self._etcd_start: asyncio.Task[GtmError | None] | None = None
        self._links: tuple[LinkInfo, ...] = ()
        self._chaos_api: str | None = None
        self._started: Started | None = None
        self._ready = False
        self._gpu_urls: dict[str, str] = {}
        self._store: StateStore | None = None
        self._state = plan.config.state
        self.children: list[Child] = []
        self._stopping = False
        self._status_server: HttpServer | None = None
        self._rng = random.Random()
        #: Private etcd members the control API stopped on purpose (not restarted).
        self._etcd_held: set[str] = set()
        #: Restarts of each private etcd member after it died, and the failed attempts
        #: of an outage in progress.
        self._etcd_restarts: dict[str, int] = {}
        self._etcd_outage: dict[str, int] = {}
        self._etcd_restart: asyncio.Task[GtmError | None] | None = None
        self._etcd_restarted = Counter(
            "gtm_up_etcd_restarts_total",
            "Members of gtm up's private etcd restarted after they died.",
            ["member"],
            registry=self._registry,
        )

    @property
    def store(self) -> StateStore:
        if self._store is None:
            raise RuntimeError("the deployment is not started")
        return self._store

    @property
    def state_url(self) -> str:
        return self._state

    async def start(self) -> Started:
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> Started:
        plan = self.plan
        # gRPC (the etcd client) prints a line per fork while its threads run; the
        # children exec at once, so its fork handlers have nothing to do.
        os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
        if not plan.config.uses_etcd:
            self._etcd = EtcdCluster(plan.run_dir / "etcd", members=plan.config.etcd_members)
            # Members start in threads (each blocks until healthy). A cancelled await
            # does not stop a thread, so stop() waits for this task before stopping etcd.
            self._etcd_start = self._supervisor.spawn("etcd-start", _start_etcd(self._etcd))
            failure = await asyncio.shield(self._etcd_start)
            if failure is not None:
                raise failure
            self._state = self._etcd.etcd_url
            log.info("started a private etcd at %s", self._state)
            self._supervisor.run_loop("etcd-keeper", self._keep_etcd, interval=ETCD_CHECK_S)
        dns = _fixed(plan.dns)
        http = _fixed(plan.http, avoid={dns.port})
        logs = plan.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        audit = plan.run_dir / "audit"
        audit.mkdir(exist_ok=True)
        config = plan.config
        self._links = self._plan_links()
        if self._links:
            await self._start_chaos_proxy(avoid={dns.port, http.port})
        self._store = open_store(self._state, clock=self._clock, registry=self._registry)
        moved = {
            link.target.partition("/")[2]: f"http://{link.listen}"
            for link in self._links
            if link.kind is not LinkKind.ETCD
        }
        # gtm up --tls: every child gets its identity's certificate (gtmctl/up/tls.py).
        tls_dir = tls_directory(config)
        tls = LocalTls.prepare(plan.deployment, tls_dir) if tls_dir is not None else None
        await seed_store(
            self._store, plan, self._clock, urls=moved_urls(plan.deployment, tls, moved)
        )

        def with_tls(argv: list[str], identity: str) -> list[str]:
            return argv if tls is None else [*argv, *tls.argv(identity)]

        kv_events_dir = plan.run_dir / "kv-events" if config.kv_events else None
        if kv_events_dir is not None:
            kv_events_dir.mkdir(exist_ok=True)
        for gpu in plan.deployment.gpus:
            state = self._state_for(f"gpu/{gpu.id}")
            argv = gpu_argv(gpu, state, config.speedup, kv_events_dir=kv_events_dir)
            argv = with_tls(argv, f"gpu/{gpu.id}")
            self._add(gpu.id, TierKind.GPU, argv)
        for zone in plan.deployment.zones:
            state = self._state_for(f"zone/{zone.id}")
            argv = zone_argv(
                zone,
                state,
                config.scrape_interval_s,
                config.tiers,
                worker_key_file=config.worker_api_key_file,
                gpu_profiles=config.gpu_profiles,
                kv_events=config.kv_events,
            )
            argv = with_tls(argv, f"zone/{zone.id}")
            self._add(zone.id, TierKind.ZONE, argv)
        for region in plan.deployment.regions:
            state = self._state_for(f"regional/{region.id}")
            advertise = https(region.url) if tls is not None else None
            argv = regional_argv(region, state, audit, advertise=advertise, plan=plan)
            self._add(region.id, TierKind.REGIONAL, with_tls(argv, f"region/{region.id}"))
        state = self._state_for("global")
        argv = with_tls(global_argv(plan, state, dns, http), GLOBAL_IDENTITY)
        self._add("global", TierKind.GLOBAL, argv)
        for child in self.children:
            if child.process is None:
                await self._spawn(child)
                self._supervisor.spawn(f"watch:{child.name}", self._watch(child))
        status_url = await self._start_status(http)
        self._started = Started(dns=dns, http=http, status_url=status_url, state=self._state)
        return self._started

    # ------------------------------------------------------------------ chaos links

    def _etcd_upstreams(self) -> dict[str, str]:
        """etcd member name → its client address (``HOST:PORT``)."""
        if self._etcd is not None:
            return {
                name: f"{member.host}:{member.port}" for name, member in self._etcd.members.items()
            }
        endpoints = parse_state_url(self._state).endpoints
        return {f"etcd-{i}": str(e) for i, e in enumerate(endpoints, start=1)}

    def _plan_links(self) -> tuple[LinkInfo, ...]:
        """The fault-proxy links ``--chaos-links`` asks for; each listens on a port the
        proxy picks (``:0``), read back once it started."""
        kinds = set(self.plan.config.chaos_links)
        deployment = self.plan.deployment
        pairs: list[tuple[LinkKind, str, str, str]] = []
        if LinkKind.GLOBAL_REGIONAL in kinds:
            for region in deployment.regions:
                upstream = str(HostPort(region.host, region.port))
                pairs.append(
                    (LinkKind.GLOBAL_REGIONAL, "global", f"regional/{region.id}", upstream)
                )
        if LinkKind.REGIONAL_ZONE in kinds:
            for zone in deployment.zones:
                upstream = str(HostPort(zone.host, zone.port))
                pairs.append(
                    (LinkKind.REGIONAL_ZONE, f"regional/{zone.region}", f"zone/{zone.id}", upstream)
                )
        if LinkKind.ETCD in kinds:
            tiers = [
                *(f"gpu/{g.id}" for g in deployment.gpus),
                *(f"zone/{z.id}" for z in deployment.zones),
                *(f"regional/{r.id}" for r in deployment.regions),
                "global",
            ]
            members = self._etcd_upstreams()
            for tier in tiers:
                for member, upstream in members.items():
                    pairs.append((LinkKind.ETCD, tier, f"etcd/{member}", upstream))
        return tuple(
            LinkInfo(
                name=link_name(source, target),
                kind=kind,
                source=source,
                target=target,
                listen="127.0.0.1:0",
                upstream=upstream,
            )
            for kind, source, target, upstream in pairs
        )

    def _state_for(self, tier: str) -> str:
        """The ``--state`` of ``tier``: its etcd links when it has any."""
        mine = [
            link.listen
            for link in self._links
            if link.kind is LinkKind.ETCD and link.source == tier
        ]
        return f"etcd://{','.join(mine)}" if mine else self._state

    async def _start_chaos_proxy(self, *, avoid: set[int]) -> None:
        """Start ``gtm chaos proxy`` with every link, wait until its API answers, and
        read back the ports its links bound. They are then written into its
        ``--config``, so a restarted proxy listens where the tiers expect it."""
        port = free_port("127.0.0.1")
        while port in avoid:  # the front door's ports are chosen but not bound yet
            port = free_port("127.0.0.1")
        config = self.plan.run_dir / "chaos-links.json"
        _write_links(config, self._links)
        self._chaos_api = f"http://127.0.0.1:{port}"
        argv = _gtm("chaos", "proxy", "--port", str(port), "--config", str(config), "--seed", "0")
        self._add("chaos-proxy", TierKind.CHAOS_PROXY, argv)
        child = self.children[-1]
        await self._spawn(child)
        self._supervisor.spawn(f"watch:{child.name}", self._watch(child))
        # It serves its API first and then creates the links of --config: wait for all.
        names = {link.name for link in self._links}
        proxies = await _wait_http(
            f"{self._chaos_api}/proxies",
            CHAOS_PROXY_START_S,
            child,
            done=lambda body: isinstance(body, dict) and names <= body.keys(),
        )
        try:
            bound = {name: str(proxy["listen"]) for name, proxy in proxies.items()}
            self._links = tuple(
                link.model_copy(update={"listen": bound[link.name]}) for link in self._links
            )
        except (AttributeError, KeyError, TypeError) as exc:
            raise ConfigError(f"the fault proxy's /proxies is not as expected: {exc!r}") from None
        _write_links(config, self._links)

    def _add(self, name: str, kind: TierKind, argv: list[str]) -> None:
        log_path = self.plan.run_dir / "logs" / f"{kind.value}-{name}.log"
        self.children.append(Child(name, kind, argv, log_path))

    async def _spawn(self, child: Child) -> None:
        # The child keeps its own descriptor of the log; ours closes at once.
        with child.log_path.open("ab") as handle:
            child.process = await asyncio.create_subprocess_exec(
                *child.argv,
                env=self._environment(child),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def _environment(self, child: Child) -> dict[str, str]:
        """The child's environment: ours, the tiers' key, and for an emulated GPU the
        workers' key (``--worker-api-key-file``) in vLLM's variable — never a key of
        the caller's shell (``VLLM_API_KEY``, or ``GTM_API_KEY``: ``gtm gpu-sim
        --api-key`` by gtm's variable rule), which the zones would not have."""
        env = {k: v for k, v in os.environ.items() if k not in _WORKER_KEY_VARIABLES}
        env[TIER_KEY_ENV] = self.plan.tier_key
        key = self.plan.worker_key
        if child.kind is TierKind.GPU and key is not None:
            env[API_KEY_ENV] = key.secret()
        return env

    async def _watch(self, child: Child) -> None:
        """Restart ``child`` whenever it exits, until the deployment stops (a held
        child is restarted by its release instead)."""
        while True:
            process = child.process
            if process is None:
                return
            code = await process.wait()
            if self._stopping:
                return
            if child.process is not process:
                continue  # a release already started a new one
            child.exited.append(code)
            if child.held:
                log.warning("%s exited with status %s; held down", child.control_name, code)
                await child.released.wait()
                continue
            delay = RESTART_BACKOFF.delay(min(child.restarts, 5), self._rng)
            log.warning(
                "%s %s exited with status %s; restarting in %.1f s (log: %s)",
                child.kind.value,
                child.name,
                code,
                delay,
                child.log_path,
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            child.restarts += 1
            await self._spawn(child)

    async def _keep_etcd(self) -> None:
        """Restart a private etcd member that died (not one the control API stopped):
        a warning when its outage starts, one line when it is back, the failed attempts
        in between only counted; restarts are counted in ``gtm_up_etcd_restarts_total``
        and in the deployment document."""
        cluster = self._etcd
        if cluster is None:
            return
        for name, member in cluster.members.items():
            if self._stopping:
                return
            if member.running or name in self._etcd_held:
                continue
            attempts = self._etcd_outage.get(name)
            if attempts is None:
                log.warning("etcd member %s died; restarting it (log: %s)", name, member.log_path)
                attempts = 0
            else:
                await asyncio.sleep(RESTART_BACKOFF.delay(min(attempts, 5), self._rng))
            self._etcd_outage[name] = attempts + 1
            if self._stopping or name in self._etcd_held:
                return
            self._etcd_restart = self._supervisor.spawn(
                f"etcd-restart:{name}", _restart_member(cluster, name)
            )
            if await asyncio.shield(self._etcd_restart) is not None:
                continue  # counted in the outage; tried again after a backoff
            del self._etcd_outage[name]
            self._etcd_restarts[name] = self._etcd_restarts.get(name, 0) + 1
            self._etcd_restarted.labels(member=name).inc()
            log.warning(
                "etcd member %s is back (pid %s) after %d attempt(s)",
                name,
                member.pid,
                attempts + 1,
            )

    async def _start_status(self, http: HostPort) -> str:
        where = self.plan.config.status()
        if self._app_hook is None or where is None:
            return f"{http.url}/status"
        app = limited_app(HttpLimits(), client_max_size=1 << 20)  # small JSON APIs only
        self._app_hook(app)
        ControlApi(self, guard=self._guard).install(app)
        self._status_server = HttpServer(
            app, where.host, where.port, what="the status page", cancel_on_disconnect=False
        )
        bound = await self._status_server.start()
        return f"{HostPort(bound.host, bound.port).url}/status"

    # ------------------------------------------------------------------ stopping

    async def stop(self) -> None:
        """Stop every child top down, then the status page, the store, the etcd."""
        self._stopping = True
        if self._status_server is not None:
            await self._status_server.stop()
            self._status_server = None
        for kind in STOP_ORDER:
            await self._stop_kind(kind)
        for starting in (self._etcd_start, self._etcd_restart):
            if starting is not None and not starting.done():
                await asyncio.wait([starting])  # its thread would outlive a cancel
        await self._supervisor.aclose()
        if self._store is not None:
            if self._etcd is None:
                await unseed_store(self._store, self.plan)
            await self._store.aclose()
            self._store = None
        if self._etcd is not None:
            await self._etcd.aclose()
            self._etcd = None

    async def _stop_kind(self, kind: TierKind) -> None:
        running = [
            c.process
            for c in self.children
            if c.kind is kind and c.process is not None and c.process.returncode is None
        ]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        waits = [asyncio.wait_for(p.wait(), STOP_GRACE_S) for p in running]
        for process, result in zip(
            running, await asyncio.gather(*waits, return_exceptions=True), strict=True
        ):
            if isinstance(result, TimeoutError):
                log.warning(
                    "pid %d did not stop within %.0f s; killing it", process.pid, STOP_GRACE_S
                )
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    def pids(self) -> dict[str, int]:
        """Live children by name (for tests and the status page)."""
        return {
            c.name: c.process.pid
            for c in self.children
            if c.process is not None and c.process.returncode is None
        }

    # ------------------------------------------------------------------ control API

    def mark_ready(self) -> None:
        self._ready = True

    def _child(self, name: str) -> Child:
        for child in self.children:
            if child.control_name == name:
                return child
        known = ", ".join(c.control_name for c in self.children)
        raise KeyError(f"no child {name!r}; children: {known}")

    async def hold(self, name: str) -> ChildInfo:
        """Keep ``name`` down when it exits (until :meth:`release`)."""
        child = self._child(name)
        if not child.held:
            child.held = True
            child.released = asyncio.Event()
        return child.info()

    async def release(self, name: str) -> ChildInfo:
        """Supervise ``name`` again; start it now if it is down."""
        child = self._child(name)
        if child.held:
            child.held = False
            if not self._stopping and child.pid is None:
                child.restarts += 1
                await self._spawn(child)
            child.released.set()
        return child.info()

    def _cluster(self) -> EtcdCluster:
        if self._etcd is None:
            raise LookupError(
                "gtm up did not start this etcd (it was given --state): it cannot control it"
            )
        return self._etcd

    async def etcd_member(self, name: str, action: str) -> EtcdMemberInfo:
        """``kill`` (SIGKILL) or ``start`` one member of the private etcd."""
        cluster = self._cluster()
        cluster.member(name)  # KeyError naming the members
        if action == "kill":
            self._etcd_held.add(name)  # an outage on purpose: not restarted
            await cluster.kill(name)
        else:
            await cluster.restart(name)
            self._etcd_held.discard(name)
        return self._member_info(cluster, name)

    async def etcd_all(self, action: str) -> tuple[EtcdMemberInfo, ...]:
        """``stop`` (SIGKILL: an outage; data are kept) or ``start`` every member of
        the private etcd."""
        cluster = self._cluster()
        if action == "stop":
            self._etcd_held.update(cluster.names)
            await cluster.kill_all()
        else:
            await cluster.start_all()
            self._etcd_held.clear()
        return tuple(self._member_info(cluster, n) for n in cluster.names)

    def _member_info(self, cluster: EtcdCluster, name: str) -> EtcdMemberInfo:
        member = cluster.member(name)
        return EtcdMemberInfo(
            name=name,
            client_url=member.client_url,
            pid=member.pid,
            held=name in self._etcd_held,
            restarts=self._etcd_restarts.get(name, 0),
        )

    async def _gpu_info(self) -> tuple[GpuInfo, ...]:
        """GPUs with their registered URLs (the last known while the store is down)."""
        try:
            result = await self.store.range(keys.prefix(keys.Kind.GPU))
        except StateError:
            pass
        else:
            for kv in result.kvs:
                with contextlib.suppress(StateError):
                    worker = codec.decode(kv.key, kv.value, GpuWorker)
                    self._gpu_urls[worker.id] = worker.url
        return tuple(
            GpuInfo(name=g.id, region=g.region, zone=g.zone, url=self._gpu_urls.get(g.id))
            for g in self.plan.deployment.gpus
        )

    async def document(self) -> DeploymentDocument:
        """``GET /api/v1/deployment``."""
        started = self._started
        if started is None:
            raise LookupError("starting")
        deployment = self.plan.deployment
        cluster = self._etcd
        return DeploymentDocument(
            ready=self._ready,
            front_door_url=started.http.url,
            dns_host=started.dns.host,
            dns_port=started.dns.port,
            status_url=started.status_url,
            state=self._state,
            run_dir=str(self.plan.run_dir),
            regions=tuple(
                RegionInfo(name=r.id, url=r.url, zones=tuple(z.id for z in r.zones))
                for r in deployment.regions
            ),
            zones=tuple(ZoneInfo(name=z.id, region=z.region, url=z.url) for z in deployment.zones),
            gpus=await self._gpu_info(),
            children=tuple(c.info() for c in self.children),
            etcd=()
            if cluster is None
            else tuple(self._member_info(cluster, n) for n in cluster.names),
            chaos_api_url=self._chaos_api,
            links=self._links,
        )


def _write_links(path: Path, links: tuple[LinkInfo, ...]) -> None:
    """The fault proxy's ``--config`` (a ``/populate`` body)."""
    body = [
        {"name": link.name, "listen": link.listen, "upstream": link.upstream, "enabled": True}
        for link in links
    ]
    path.write_text(json.dumps(body, indent=2) + "\n", "utf-8")


async def _wait_http(url: str, limit_s: float, child: Child, *, done: Callable[[Any], bool]) -> Any:
    """Wait until ``url`` answers 200 with a JSON body that is ``done`` (bounded) and
    return it; fail early if ``child`` exits."""
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with session.get(url) as response:
                    if response.status == 200:
                        body = await response.json()
                        if done(body):
                            return body
            process = child.process
            if process is None or process.returncode is not None or time.monotonic() > deadline:
                raise ConfigError(
                    f"{child.control_name} did not answer {url} (see {child.log_path})"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 0.05)

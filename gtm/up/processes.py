"""``gtm up --processes``: every tier and every emulated GPU its own OS process, sharing
one etcd — a real multi-process deployment on one machine.

The children are the ordinary commands (``gtm gpu-sim``, ``gtm zone``, ``gtm regional``,
``gtm global``), run with this interpreter (``python -m gtm.cli``), each logging to its
own file in the run directory. ``gtm up`` supervises them:

* a child that exits while the deployment runs is restarted (after a backoff), so a
  ``kill`` of a regional LB is a failover drill, not the end of the demo;
* each child is in a session of its own, so a Ctrl-C in the terminal reaches only
  ``gtm up``, which stops the tiers top down (global, regional, zone, GPU: SIGTERM,
  then SIGKILL after a grace period); on Linux each child also gets
  ``PR_SET_PDEATHSIG``, so even a ``kill -9`` of ``gtm up`` leaves no orphans.

Without ``--state etcd://…``, ``gtm up`` starts a private etcd in the run directory
(:class:`gtm.testing.etcd.EtcdServer`) and stops it last.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import random
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from aiohttp import web

from gtm.clock import Clock
from gtm.errors import ConfigError, GtmError
from gtm.metrics import new_registry
from gtm.state.store import StateStore
from gtm.state.url import open_store
from gtm.tasks import Backoff, TaskSupervisor
from gtm.testing.etcd import EtcdServer
from gtm.topology import GpuPlacement, RegionPlacement, ZonePlacement
from gtm.up.config import HostPort
from gtm.up.fleet import Plan, Started, seed_store, unseed_store
from gtm.up.inprocess import LOCAL_PROXIES

log = logging.getLogger(__name__)

#: How long a tier gets to stop after SIGTERM before SIGKILL, s (the regional LB's own
#: grace for in-flight requests is 5 s).
STOP_GRACE_S = 8.0
#: Restart backoff of a child that died (full jitter, capped).
RESTART_BACKOFF = Backoff(initial=0.5, maximum=10.0)
#: Linux prctl option: signal sent to a child when its parent dies.
_PR_SET_PDEATHSIG = 1

AppHook = Callable[[web.Application], None]


class TierKind(StrEnum):
    GPU = "gpu-sim"
    ZONE = "zone"
    REGIONAL = "regional"
    GLOBAL = "global"


#: Stop order: the entry points first, so nothing sends work to a stopped tier below.
STOP_ORDER = (TierKind.GLOBAL, TierKind.REGIONAL, TierKind.ZONE, TierKind.GPU)


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


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the child, before exec: get SIGTERM when the parent dies (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def _start_etcd(server: EtcdServer) -> GtmError | None:
    """Start ``server`` in a thread; its failure is returned (the caller raises it), so
    the supervisor does not log it a second time as a crash."""
    try:
        await asyncio.to_thread(server.start)
    except GtmError as exc:
        return exc
    return None


def free_port(host: str) -> int:
    """A port free for both TCP and UDP on ``host`` now (a DNS server needs both)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(50):
        with socket.socket(family, socket.SOCK_STREAM) as tcp:
            tcp.bind((host, 0))
            port = int(tcp.getsockname()[1])
            with socket.socket(family, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((host, port))
                except OSError:
                    continue
            return port
    raise ConfigError(f"no free port on {host}")


def _fixed(address: HostPort) -> HostPort:
    return address if address.port else HostPort(address.host, free_port(address.host))


def _gtm(*args: str) -> list[str]:
    return [sys.executable, "-m", "gtm.cli", "--log-level", "info", *args]


def gpu_argv(gpu: GpuPlacement, state: str, speedup: float) -> list[str]:
    models = [arg for m in gpu.models for arg in ("--model", m)]
    return _gtm(
        "gpu-sim",
        *("--host", gpu.host, "--port", "0", "--gpu-type", gpu.gpu_type, *models),
        *("--speedup", repr(speedup), "--seed", str(gpu.seed), "--state", state),
        *("--region", gpu.region, "--zone", gpu.zone, "--worker-id", gpu.id),
    )


def zone_argv(zone: ZonePlacement, state: str, scrape_interval_s: float) -> list[str]:
    return _gtm(
        "zone",
        *("--zone", zone.id, "--region", zone.region, "--state", state),
        *("--listen", f"{zone.host}:{zone.port}", "--scrape-interval", repr(scrape_interval_s)),
    )


def regional_argv(region: RegionPlacement, state: str, audit_root: Path) -> list[str]:
    # One audit directory per writer: a writer locks its directory.
    return _gtm(
        "regional",
        *("--region", region.id, "--state", state, "--listen", f"{region.host}:{region.port}"),
        *("--replica-id", f"{region.id}-1", "--advertise-url", region.url),
        *("--audit-dir", str(audit_root / f"regional-{region.id}")),
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
    )


class ProcessFleet:
    """The deployment as supervised child processes: ``start()``, then ``stop()``."""

    def __init__(self, plan: Plan, *, clock: Clock, app_hook: AppHook | None = None) -> None:
        self.plan = plan
        self._clock = clock
        self._app_hook = app_hook
        self._registry = new_registry()
        self._supervisor = TaskSupervisor(registry=self._registry, clock=clock, component="up")
        self._etcd: EtcdServer | None = None
        self._etcd_start: asyncio.Task[GtmError | None] | None = None
        self._store: StateStore | None = None
        self._state = plan.config.state
        self.children: list[Child] = []
        self._stopping = False
        self._status_runner: web.AppRunner | None = None
        self._rng = random.Random()

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
            self._etcd = EtcdServer(plan.run_dir / "etcd", fsync=False)
            # Started in a thread (it blocks until healthy). A cancelled await does not
            # stop the thread, so stop() waits for this task before stopping etcd.
            self._etcd_start = self._supervisor.spawn("etcd-start", _start_etcd(self._etcd))
            failure = await asyncio.shield(self._etcd_start)
            if failure is not None:
                raise failure
            self._state = self._etcd.etcd_url
            log.info("started a private etcd at %s", self._state)
        self._store = open_store(self._state, clock=self._clock, registry=self._registry)
        await seed_store(self._store, plan, self._clock)
        dns, http = _fixed(plan.dns), _fixed(plan.http)
        logs = plan.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        audit = plan.run_dir / "audit"
        audit.mkdir(exist_ok=True)
        state, config = self._state, plan.config
        for gpu in plan.deployment.gpus:
            self._add(gpu.id, TierKind.GPU, gpu_argv(gpu, state, config.speedup))
        for zone in plan.deployment.zones:
            self._add(zone.id, TierKind.ZONE, zone_argv(zone, state, config.scrape_interval_s))
        for region in plan.deployment.regions:
            self._add(region.id, TierKind.REGIONAL, regional_argv(region, state, audit))
        self._add("global", TierKind.GLOBAL, global_argv(plan, state, dns, http))
        for child in self.children:
            await self._spawn(child)
            self._supervisor.spawn(f"watch:{child.name}", self._watch(child))
        status_url = await self._start_status(http)
        return Started(dns=dns, http=http, status_url=status_url, state=self._state)

    def _add(self, name: str, kind: TierKind, argv: list[str]) -> None:
        log_path = self.plan.run_dir / "logs" / f"{kind.value}-{name}.log"
        self.children.append(Child(name, kind, argv, log_path))

    async def _spawn(self, child: Child) -> None:
        # The child keeps its own descriptor of the log; ours closes at once.
        with child.log_path.open("ab") as handle:
            child.process = await asyncio.create_subprocess_exec(
                *child.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=handle,
                stderr=handle,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    async def _watch(self, child: Child) -> None:
        """Restart ``child`` whenever it exits, until the deployment stops."""
        while True:
            process = child.process
            if process is None:
                return
            code = await process.wait()
            if self._stopping:
                return
            child.exited.append(code)
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

    async def _start_status(self, http: HostPort) -> str:
        where = self.plan.config.status()
        if self._app_hook is None or where is None:
            return f"{http.url}/status"
        app = web.Application()
        self._app_hook(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._status_runner = runner
        try:
            await web.TCPSite(runner, where.host, where.port).start()
        except OSError as exc:
            raise ConfigError(
                f"cannot listen for the status page on {where}: {exc.strerror}"
            ) from None
        bound = runner.addresses[0]
        return f"{HostPort(str(bound[0]), int(bound[1])).url}/status"

    # ------------------------------------------------------------------ stopping

    async def stop(self) -> None:
        """Stop every child top down, then the status page, the store, the etcd."""
        self._stopping = True
        if self._status_runner is not None:
            await self._status_runner.cleanup()
            self._status_runner = None
        for kind in STOP_ORDER:
            await self._stop_kind(kind)
        if self._etcd_start is not None and not self._etcd_start.done():
            await asyncio.wait([self._etcd_start])
        await self._supervisor.aclose()
        if self._store is not None:
            if self._etcd is None:
                await unseed_store(self._store, self.plan)
            await self._store.aclose()
            self._store = None
        if self._etcd is not None:
            await asyncio.to_thread(self._etcd.stop)
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

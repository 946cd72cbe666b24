"""A handle on a running multi-process deployment, for faults and the game-day runner.

Two ways in, both async context managers::

    async with Deployment.launch(LaunchSpec(topology=path, speedup=20, etcd_members=3)) as d:
        ...   # gtm up --processes runs as a subprocess; it is stopped on exit
    async with Deployment.attach("http://127.0.0.1:8081/status") as d:
        ...   # someone else's gtm up --processes; left running on exit

The control API is an admin API: the handle sends ``gtm up``'s operator token. A
launched deployment gets an admin directory of its own (``--admin-dir``), whose token it
reads; an attached one takes ``admin_token`` or ``admin_token_file``, else the local
operator token ``gtm up`` keeps in :func:`gtm.admin_auth.default_admin_dir`.

Everything the handle knows comes from ``gtm up``'s control API
(:mod:`gtmctl.up.control`): :meth:`Deployment.refresh` re-reads it (pids change when the
supervisor restarts a child). Launching waits for ``ready`` in that document — set only
after gtm up's own readiness check passed (every zone, region, DNS name and the front
door answer) — and fails fast, with the tail of gtm up's log, if gtm up exits first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import aiohttp
from pydantic import Field, ValidationError

from gtm.admin_auth import LOCAL_TOKEN_NAME, default_admin_dir, read_token
from gtm.clock import SystemClock
from gtm.errors import GtmError
from gtm.metrics import new_registry
from gtm.models import Frozen
from gtm.net import free_port
from gtm.state.store import StateStore
from gtm.state.url import open_store
from gtmctl.up.control import (
    ChildInfo,
    DeploymentDocument,
    EtcdMemberInfo,
    GpuInfo,
    LinkInfo,
    LinkKind,
    RegionInfo,
    ZoneInfo,
)

#: Bounds for a loaded 2-core machine.
DEFAULT_READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
#: Longest wait for one teardown step before the handle moves on (see ``aclose``).
CLOSE_STEP_S = 10.0
#: Between two reads of the control API while waiting for ``ready``.
POLL_INTERVAL_S = 0.2
#: A control call may start an etcd cluster (an election) on a loaded machine.
HTTP_TIMEOUT_S = 30.0

_T = TypeVar("_T")

log = logging.getLogger(__name__)


class DeploymentError(GtmError):
    """The deployment did not start, or its control API refused a request."""


class UnknownTarget(DeploymentError):
    """A fault names a region, zone, GPU, tier, member or link the deployment lacks."""


class LaunchSpec(Frozen):
    """How :meth:`Deployment.launch` runs ``gtm up --processes``."""

    topology: Path | None = None
    policies: tuple[Path, ...] = ()
    speedup: float = Field(default=1.0, gt=0.0, le=1000.0)
    etcd_members: Literal[1, 3] = 1
    run_dir: Path | None = None
    chaos_links: tuple[LinkKind, ...] = ()
    ready_timeout_s: float = Field(default=DEFAULT_READY_TIMEOUT_S, gt=0.0)
    scrape_interval_s: float = Field(default=0.25, gt=0.0)
    #: Extra ``gtm up`` options, appended last.
    extra_args: tuple[str, ...] = ()
    #: Environment variables set for ``gtm up`` and so its children (a chaos mutant's).
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class DnsAddress:
    host: str
    port: int


def _base(status_url: str) -> str:
    parsed = urllib.parse.urlsplit(status_url)
    return f"{parsed.scheme}://{parsed.netloc}"


def _quote_child(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class Deployment:
    """See the module docstring. Build with :meth:`launch` or :meth:`attach`."""

    def __init__(
        self, *, status_url: str | None, spec: LaunchSpec | None, admin_token: str | None = None
    ) -> None:
        self._status_url = status_url
        self._spec = spec
        self._token = admin_token
        self._scratch: Path | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._log_path: Path | None = None
        self._session: aiohttp.ClientSession | None = None
        self._doc: DeploymentDocument | None = None
        self._store: StateStore | None = None

    # ------------------------------------------------------------------ entry

    @classmethod
    def launch(cls, spec: LaunchSpec) -> Self:
        """``gtm up --processes`` with ``spec``, started on ``async with``."""
        return cls(status_url=None, spec=spec)

    @classmethod
    def attach(
        cls,
        status_url: str,
        *,
        admin_token: str | None = None,
        admin_token_file: Path | None = None,
    ) -> Self:
        """A deployment already running (its status page URL, or its base URL).
        The operator token: ``admin_token``, else read from ``admin_token_file``, else
        the local one gtm up created (none: loopback-only, as gtm up without tokens)."""
        if admin_token is None:
            path = admin_token_file or default_admin_dir() / LOCAL_TOKEN_NAME
            if admin_token_file is not None or path.exists():
                admin_token = read_token(path)
        return cls(status_url=status_url, spec=None, admin_token=admin_token)

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S))
        try:
            if self._spec is not None:
                await self._launch(self._spec)
            else:
                await self.refresh()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the store and session; stop gtm up if this handle launched it.

        Each step is bounded (``CLOSE_STEP_S``): a store or session that does not close
        in time is logged and left behind, so the deployment below is always stopped.
        """
        store, self._store = self._store, None
        if store is not None:
            await _bounded("closing the state store", store.aclose())
        session, self._session = self._session, None
        if session is not None:
            await _bounded("closing the HTTP session", session.close())
        if self._process is not None:
            await self._stop_process(self._process)
            self._process = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    # ------------------------------------------------------------------ what it is

    @property
    def document(self) -> DeploymentDocument:
        if self._doc is None:
            raise DeploymentError("the deployment handle is not entered")
        return self._doc

    @property
    def status_url(self) -> str:
        return self.document.status_url

    @property
    def control_url(self) -> str:
        """The base URL of the status listener (``/api/v1/...``)."""
        return _base(self.document.status_url)

    @property
    def front_door_url(self) -> str:
        return self.document.front_door_url

    @property
    def dns(self) -> DnsAddress:
        return DnsAddress(self.document.dns_host, self.document.dns_port)

    @property
    def state_url(self) -> str:
        return self.document.state

    @property
    def run_dir(self) -> Path:
        return Path(self.document.run_dir)

    @property
    def regions(self) -> dict[str, RegionInfo]:
        return {r.name: r for r in self.document.regions}

    @property
    def zones(self) -> dict[str, ZoneInfo]:
        return {z.name: z for z in self.document.zones}

    @property
    def gpus(self) -> dict[str, GpuInfo]:
        return {g.name: g for g in self.document.gpus}

    @property
    def children(self) -> dict[str, ChildInfo]:
        """Every supervised process by control name (``regional/eu-west`` …)."""
        return {c.name: c for c in self.document.children}

    @property
    def pids(self) -> dict[str, int]:
        """Live children: name → pid (as of the last :meth:`refresh`)."""
        return {c.name: c.pid for c in self.document.children if c.pid is not None}

    @property
    def etcd_members(self) -> dict[str, EtcdMemberInfo]:
        return {m.name: m for m in self.document.etcd}

    @property
    def chaos_api_url(self) -> str | None:
        return self.document.chaos_api_url

    @property
    def links(self) -> dict[str, LinkInfo]:
        return {link.name: link for link in self.document.links}

    # ------------------------------------------------------------------ lookups

    def region(self, name: str) -> RegionInfo:
        return self._lookup("region", name, self.regions)

    def zone(self, name: str) -> ZoneInfo:
        return self._lookup("zone", name, self.zones)

    def gpu(self, name: str) -> GpuInfo:
        return self._lookup("gpu", name, self.gpus)

    def child(self, name: str) -> ChildInfo:
        return self._lookup("tier", name, self.children)

    def etcd_member(self, name: str) -> EtcdMemberInfo:
        return self._lookup("etcd member", name, self.etcd_members)

    @staticmethod
    def _lookup(what: str, name: str, known: dict[str, _T]) -> _T:
        try:
            return known[name]
        except KeyError:
            shown = ", ".join(sorted(known)) or "none"
            raise UnknownTarget(f"unknown {what} {name!r}; the deployment has: {shown}") from None

    # ------------------------------------------------------------------ control API

    async def refresh(self) -> DeploymentDocument:
        """Re-read ``/api/v1/deployment``."""
        base = _base(self._status_url) if self._status_url else None
        if base is None:
            raise DeploymentError("no status URL yet")
        body = await self._request("GET", f"{base}/api/v1/deployment")
        try:
            self._doc = DeploymentDocument.model_validate(body)
        except ValidationError as exc:
            raise DeploymentError(f"{base}/api/v1/deployment: unexpected document: {exc}") from None
        return self._doc

    async def hold(self, child: str) -> ChildInfo:
        """Tell gtm up's supervisor to keep ``child`` down when it exits."""
        self.child(child)
        body = await self._request(
            "POST", f"{self.control_url}/api/v1/children/{_quote_child(child)}/hold"
        )
        return ChildInfo.model_validate(body)

    async def release(self, child: str) -> ChildInfo:
        """Supervise ``child`` again, restarting it now if it is down."""
        self.child(child)
        body = await self._request(
            "POST", f"{self.control_url}/api/v1/children/{_quote_child(child)}/release"
        )
        return ChildInfo.model_validate(body)

    async def etcd_kill(self, member: str) -> None:
        self.etcd_member(member)
        await self._request(
            "POST", f"{self.control_url}/api/v1/etcd/members/{_quote_child(member)}/kill"
        )

    async def etcd_start(self, member: str) -> None:
        self.etcd_member(member)
        await self._request(
            "POST", f"{self.control_url}/api/v1/etcd/members/{_quote_child(member)}/start"
        )

    async def etcd_stop_all(self) -> None:
        self._need_etcd()
        await self._request("POST", f"{self.control_url}/api/v1/etcd/stop")

    async def etcd_start_all(self) -> None:
        self._need_etcd()
        await self._request("POST", f"{self.control_url}/api/v1/etcd/start")

    async def etcd_leader(self) -> str:
        """The name of the etcd member that is leader now (asks the members)."""
        from gtm.state.etcd_cluster import find_leader

        self._need_etcd()
        members = {m.name: m.client_url for m in self.document.etcd}
        assert self._session is not None
        return await find_leader(self._session, members)

    async def etcd_make_leader(self, member: str) -> None:
        """Move the etcd leadership to ``member`` (etcd's MoveLeader; bounded wait)."""
        from gtm.state.etcd_cluster import transfer_leadership

        self._need_etcd()
        self.etcd_member(member)
        members = {m.name: m.client_url for m in self.document.etcd}
        assert self._session is not None
        await transfer_leadership(self._session, members, member)

    @property
    def etcd_clients_member(self) -> str:
        """The member the tiers talk to first: the first of their ``--state`` (the
        members in the deployment document's order, as ``gtm up`` lists them)."""
        self._need_etcd()
        return self.document.etcd[0].name

    def _need_etcd(self) -> None:
        if not self.document.etcd:
            raise UnknownTarget(
                "this deployment's etcd is not gtm up's own (it was given --state): "
                "etcd faults need a private etcd"
            )

    async def drain(self, target: Literal["region", "zone", "gpu"], name: str) -> None:
        await self._request("POST", f"{self.control_url}/api/v1/drains/{target}/{name}")

    async def undrain(self, target: Literal["region", "zone", "gpu"], name: str) -> None:
        await self._request("DELETE", f"{self.control_url}/api/v1/drains/{target}/{name}")

    def store(self) -> StateStore:
        """A store client on the deployment's etcd (direct, never through a link);
        closed with the handle."""
        if self._store is None:
            self._store = open_store(self.state_url, clock=SystemClock(), registry=new_registry())
        return self._store

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise DeploymentError("the deployment handle is not entered")
        return self._session

    def auth_headers(self) -> dict[str, str]:
        """The ``Authorization`` header for gtm's admin APIs (empty without a token)."""
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _request(self, method: str, url: str) -> Any:
        try:
            async with self.session.request(method, url, headers=self.auth_headers()) as response:
                body = await response.json(content_type=None)
                if response.status >= 400:
                    error = body.get("error") if isinstance(body, dict) else body
                    raise DeploymentError(f"{method} {url}: HTTP {response.status}: {error}")
                return body
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise DeploymentError(f"{method} {url}: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ launching

    def _command(self, spec: LaunchSpec, status_port: int, admin_dir: Path) -> list[str]:
        command = [sys.executable, "-m", "gtmctl", "up", "--processes"]
        if spec.topology is not None:
            command += ["--topology", str(spec.topology)]
        for policy in spec.policies:
            command += ["--policies", str(policy)]
        command += [
            *("--dns-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"),
            *("--status-listen", f"127.0.0.1:{status_port}"),
            *("--speedup", repr(spec.speedup), "--etcd-members", str(spec.etcd_members)),
            *("--scrape-interval", repr(spec.scrape_interval_s)),
            *("--ready-timeout", repr(spec.ready_timeout_s)),
            *("--admin-dir", str(admin_dir)),
        ]
        if spec.run_dir is not None:
            command += ["--run-dir", str(spec.run_dir)]
        if spec.chaos_links:
            command += ["--chaos-links", ",".join(k.value for k in spec.chaos_links)]
        return command + list(spec.extra_args)

    async def _launch(self, spec: LaunchSpec) -> None:
        status_port = free_port("127.0.0.1")
        self._status_url = f"http://127.0.0.1:{status_port}/status"
        # Our own files (gtm up's admin directory and its stderr) go in the run
        # directory when there is one (kept), else in a scratch directory (removed).
        if spec.run_dir is not None:
            own = spec.run_dir
            own.mkdir(parents=True, exist_ok=True)
        else:
            own = self._scratch = Path(tempfile.mkdtemp(prefix="gtm-chaos-"))
        admin_dir = own / "admin"
        self._log_path = own / "gtm-up.stderr"
        with self._log_path.open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self._command(spec, status_port, admin_dir),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                env={**os.environ, **dict(spec.env)} if spec.env else None,
            )
        await self._wait_ready(spec.ready_timeout_s + 15.0, admin_dir)

    async def _wait_ready(self, limit_s: float, admin_dir: Path) -> None:
        deadline = time.monotonic() + limit_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            process = self._process
            if process is not None and process.returncode is not None:
                raise DeploymentError(
                    f"gtm up exited with status {process.returncode} before it was ready; "
                    f"its log ({self._log_path}):\n{self._log_tail()}"
                )
            token_path = admin_dir / LOCAL_TOKEN_NAME
            if self._token is None and token_path.exists():
                self._token = read_token(token_path)
            try:
                doc = await self.refresh()
            except DeploymentError as exc:
                last = str(exc)
            else:
                if doc.ready:
                    return
                last = "gtm up is starting"
            with contextlib.suppress(TimeoutError):
                assert process is not None
                await asyncio.wait_for(process.wait(), POLL_INTERVAL_S)
        raise DeploymentError(
            f"gtm up was not ready within {limit_s:.0f} s ({last}); its log "
            f"({self._log_path}):\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 30) -> str:
        if self._log_path is None:
            return ""
        try:
            text = self._log_path.read_text("utf-8", errors="replace")
        except OSError as exc:
            return f"(unreadable: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    async def _stop_process(self, process: asyncio.subprocess.Process) -> None:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


async def _bounded(what: str, step: Coroutine[Any, Any, None]) -> None:
    try:
        async with asyncio.timeout(CLOSE_STEP_S):
            await step
    except TimeoutError:
        log.warning("chaos deployment: %s took over %g s; moving on", what, CLOSE_STEP_S)

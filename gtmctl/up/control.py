"""``gtm up --processes``'s control API, for chaos tooling and tests (loopback only).

Served on the status page's listener, next to ``/api/v1/fleet``:

=====================================================  ===================================
``GET  /api/v1/deployment``                            :class:`DeploymentDocument`: where
                                                       everything listens, the children's
                                                       pids, the etcd members, the chaos
                                                       proxy links, ``ready``
``POST /api/v1/children/{name}/hold``                  keep that child down: the supervisor
                                                       does not restart it when it exits
``POST /api/v1/children/{name}/release``               restart it now if it is down, and
                                                       supervise it again
``POST /api/v1/etcd/members/{name}/kill``              SIGKILL one etcd member
``POST /api/v1/etcd/members/{name}/start``             start it again (same data dir/ports)
``POST /api/v1/etcd/stop`` / ``/api/v1/etcd/start``    the whole private etcd cluster
                                                       (stop is SIGKILL: an outage)
=====================================================  ===================================

Why a hold and not a flag file: a hold must be acknowledged (the caller needs to know
the supervisor saw it before it kills the process, or the restart races the kill), and
the status listener is already there, loopback-only, with JSON errors. Child names are
``global``, ``regional/<region>``, ``zone/<zone>``, ``gpu/<gpu>`` and ``chaos-proxy``;
in URLs as they are (``/api/v1/children/regional/eu-west/hold``) or percent-encoded.

The etcd endpoints exist only when ``gtm up`` started the etcd itself (no ``--state``).

These are admin APIs (:mod:`gtm.admin_auth`), guarded like the drain API: ``gtm up``
requires its operator token (``Authorization: Bearer …``; a read-only token may ``GET``
the document), and every call is audited. Without a guard only loopback clients may
call them.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Protocol

from aiohttp import web
from pydantic import Field

from gtm.admin_auth import AdminGuard, admin_middleware, is_loopback_peer, path_prefix
from gtm.errors import GtmError
from gtm.models import Frozen


class LinkKind(StrEnum):
    """Which inter-tier connections ``--chaos-links`` routes through the fault proxy."""

    GLOBAL_REGIONAL = "global-regional"
    REGIONAL_ZONE = "regional-zone"
    ETCD = "etcd"


class ChildInfo(Frozen):
    name: str
    kind: str
    pid: int | None = None
    held: bool = False
    restarts: int = 0


class GpuInfo(Frozen):
    name: str
    region: str
    zone: str
    #: From the worker's registration in the store (None until it registered).
    url: str | None = None

    @property
    def port(self) -> int | None:
        """The worker's port (it changes when the worker restarts: it binds port 0)."""
        return None if self.url is None else urllib.parse.urlsplit(self.url).port


class ZoneInfo(Frozen):
    name: str
    region: str
    url: str


class RegionInfo(Frozen):
    name: str
    url: str
    zones: tuple[str, ...]


class EtcdMemberInfo(Frozen):
    name: str
    client_url: str
    pid: int | None = None
    #: Stopped through this API: gtm up does not restart it until it is started again.
    held: bool = False
    #: Times gtm up restarted it after it died.
    restarts: int = 0


class LinkInfo(Frozen):
    """One fault-proxy link: ``source`` reaches ``target`` through ``listen``."""

    name: str
    kind: LinkKind
    source: str
    target: str
    listen: str
    upstream: str


class DeploymentDocument(Frozen):
    """``GET /api/v1/deployment``."""

    ready: bool
    front_door_url: str
    dns_host: str
    dns_port: int = Field(ge=1, le=65535)
    status_url: str
    #: The store, as gtm up itself reaches it (never through a fault-proxy link).
    state: str
    run_dir: str
    regions: tuple[RegionInfo, ...]
    zones: tuple[ZoneInfo, ...]
    gpus: tuple[GpuInfo, ...]
    children: tuple[ChildInfo, ...]
    #: Empty when the store is not gtm up's own etcd.
    etcd: tuple[EtcdMemberInfo, ...] = ()
    #: The fault proxy's Toxiproxy API (None without --chaos-links).
    chaos_api_url: str | None = None
    links: tuple[LinkInfo, ...] = ()


def link_name(source: str, target: str) -> str:
    """A link's proxy name: ``<source>-><target>`` with ``/`` as ``.`` (Toxiproxy puts
    names in URL paths)."""
    return f"{source}->{target}".replace("/", ".")


class Controlled(Protocol):
    """What the control API drives (gtmctl.up.processes.ProcessFleet)."""

    async def document(self) -> DeploymentDocument: ...

    async def hold(self, name: str) -> ChildInfo: ...

    async def release(self, name: str) -> ChildInfo: ...

    async def etcd_member(self, name: str, action: str) -> EtcdMemberInfo: ...

    async def etcd_all(self, action: str) -> tuple[EtcdMemberInfo, ...]: ...


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class ControlApi:
    """The routes of the module docstring on an aiohttp app, over a :class:`Controlled`."""

    #: The admin routes: guarded and audited by the guard, when there is one.
    PREFIXES = ("/api/v1/deployment", "/api/v1/children/", "/api/v1/etcd/")

    def __init__(self, fleet: Controlled, *, guard: AdminGuard | None = None) -> None:
        self._fleet = fleet
        self._admin = guard

    def install(self, app: web.Application) -> None:
        if self._admin is not None:
            app.middlewares.append(admin_middleware(self._admin, path_prefix(*self.PREFIXES)))
        add = app.router.add_route
        add("GET", "/api/v1/deployment", self._guard(self._document))
        add("POST", "/api/v1/children/{name:.+}/hold", self._guard(self._hold))
        add("POST", "/api/v1/children/{name:.+}/release", self._guard(self._release))
        add("POST", "/api/v1/etcd/members/{name}/{action:kill|start}", self._guard(self._member))
        add("POST", "/api/v1/etcd/{action:stop|start}", self._guard(self._cluster))

    @staticmethod
    def _guard(handler: Handler) -> Handler:
        """Loopback only; a bad name is a 404 naming what exists; a failure a 503."""

        async def guarded(request: web.Request) -> web.Response:
            if not is_loopback_peer(request.remote):
                return _error(403, "the control API accepts loopback clients only")
            try:
                return await handler(request)
            except KeyError as exc:
                return _error(404, str(exc.args[0]) if exc.args else "not found")
            except LookupError as exc:
                return _error(409 if str(exc) != "starting" else 503, str(exc))
            except GtmError as exc:
                return _error(503, str(exc))

        return guarded

    async def _document(self, request: web.Request) -> web.Response:
        document = await self._fleet.document()
        return web.json_response(
            document.model_dump(mode="json"), headers={"Cache-Control": "no-store"}
        )

    async def _hold(self, request: web.Request) -> web.Response:
        info = await self._fleet.hold(request.match_info["name"])
        return web.json_response(info.model_dump(mode="json"))

    async def _release(self, request: web.Request) -> web.Response:
        info = await self._fleet.release(request.match_info["name"])
        return web.json_response(info.model_dump(mode="json"))

    async def _member(self, request: web.Request) -> web.Response:
        info = await self._fleet.etcd_member(
            request.match_info["name"], request.match_info["action"]
        )
        return web.json_response(info.model_dump(mode="json"))

    async def _cluster(self, request: web.Request) -> web.Response:
        members = await self._fleet.etcd_all(request.match_info["action"])
        return web.json_response({"members": [m.model_dump(mode="json") for m in members]})

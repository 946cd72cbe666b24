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
=====================================================  ===================================

Why a hold and not a flag file: a hold must be acknowledged (the caller needs to know
the supervisor saw it before it kills the process, or the restart races the kill), and
the status listener is already there, loopback-only, with JSON errors. Child names are
``global``, ``regional/<region>``, ``zone/<zone>``, ``gpu/<gpu>`` and ``chaos-proxy``;
in URLs the ``/`` is percent-encoded or written as ``.`` (``regional.eu-west``).

The etcd endpoints exist only when ``gtm up`` started the etcd itself (no ``--state``).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

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


def child_name(kind: str, name: str) -> str:
    """The control API's name of a child: ``global`` or ``<kind>/<name>``."""
    return kind if kind == name else f"{kind}/{name}"

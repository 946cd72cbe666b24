"""Faults on the fault-proxy links ``gtm up --chaos-links`` places between tiers.

Each link is a Toxiproxy proxy named ``<source>-><target>`` (``/`` written as ``.``),
e.g. ``global->regional.eu-west``, ``regional.eu-west->zone.eu-west-a``,
``zone.eu-west-a->etcd.etcd-1``. Specs pick links by ``source`` and ``target`` in the
deployment's names, with shell wildcards: ``source: zone/eu-west-a, target: etcd/*``
is that agent's connection to every etcd member.

* ``partition``: ``black-hole`` adds a ``timeout`` toxic (timeout 0: data is held, never
  delivered, until the toxic goes — a dropped route) both ways; ``refuse`` disables the
  proxy (open connections are closed, new ones refused — a dead host).
* ``latency``: a ``latency`` toxic (with jitter) on the chosen direction(s).
* ``all-health-checks-fail``: ``latency`` toxics longer than the global LB's probe
  timeout (1 s) on every global → regional link: every probe times out at once
  (the monitoring bug of scenario 11) while requests still get through, slowly.

Rollback removes exactly the toxics this fault added (and re-enables what it disabled).
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from chaos.deployment import Deployment, UnknownTarget
from chaos.faults.base import FaultError, Injected, SpecBase
from chaos.proxy.client import ToxiproxyClient
from chaos.proxy.errors import ToxiproxyError
from global_lb.health import HealthCheckConfig
from gtmctl.up.control import LinkInfo, LinkKind

#: The global LB's default health-probe timeout, ms.
PROBE_TIMEOUT_MS = round(HealthCheckConfig().timeout * 1000)
#: ``all-health-checks-fail``'s default added latency: twice the probe timeout, so
#: jitter-free probes fail every time.
HEALTH_FAIL_LATENCY_MS = 2 * PROBE_TIMEOUT_MS

Pattern = Annotated[str, Field(min_length=1, max_length=256)]


class Direction(StrEnum):
    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"
    BOTH = "both"

    def streams(self) -> tuple[str, ...]:
        return ("upstream", "downstream") if self is Direction.BOTH else (self.value,)


class PartitionMode(StrEnum):
    BLACK_HOLE = "black-hole"
    REFUSE = "refuse"


def select_links(deployment: Deployment, source: str, target: str) -> list[LinkInfo]:
    """The links from ``source`` to ``target`` (wildcards allowed); UnknownTarget when
    none match, naming the links there are."""
    if deployment.chaos_api_url is None:
        raise UnknownTarget(
            "this deployment has no fault-proxy links: start it with "
            "gtm up --processes --chaos-links global-regional,regional-zone,etcd"
        )
    found = [
        link
        for link in deployment.links.values()
        if fnmatch.fnmatchcase(link.source, source) and fnmatch.fnmatchcase(link.target, target)
    ]
    if not found:
        shown = ", ".join(f"{k.source} -> {k.target}" for k in deployment.links.values())
        raise UnknownTarget(
            f"no fault-proxy link from {source!r} to {target!r}; there are: {shown}"
        )
    return found


class _Toxics:
    """Toxics (and disabled proxies) this fault added, to undo exactly those."""

    def __init__(self, api_url: str) -> None:
        self.client = ToxiproxyClient(api_url)
        self.added: list[tuple[str, str]] = []
        self.disabled: list[str] = []

    async def add(
        self, proxy: str, toxic: str, type_: str, stream: str, attributes: dict[str, object]
    ) -> None:
        await asyncio.to_thread(
            self.client.add_toxic,
            proxy,
            type_,
            stream=stream,
            name=toxic,
            attributes=attributes,
        )
        self.added.append((proxy, toxic))

    async def disable(self, proxy: str) -> None:
        await asyncio.to_thread(self.client.disable, proxy)
        self.disabled.append(proxy)

    async def undo(self) -> None:
        """Remove what was added; a toxic already gone is fine (idempotent)."""
        failures: list[str] = []
        for proxy, toxic in reversed(self.added):
            try:
                await asyncio.to_thread(self.client.delete_toxic, proxy, toxic)
            except ToxiproxyError as exc:
                if exc.status != 404:
                    failures.append(f"{proxy}/{toxic}: {exc}")
        for proxy in self.disabled:
            try:
                await asyncio.to_thread(self.client.enable, proxy)
            except ToxiproxyError as exc:
                failures.append(f"enable {proxy}: {exc}")
        self.added.clear()
        self.disabled.clear()
        self.client.close()
        if failures:
            raise FaultError("rollback left toxics behind: " + "; ".join(failures))


async def _apply(
    deployment: Deployment,
    links: list[LinkInfo],
    description: str,
    action: Action,
) -> Injected:
    api = deployment.chaos_api_url
    assert api is not None
    toxics = _Toxics(api)
    try:
        for link in links:
            await action(toxics, link)
    except BaseException as exc:
        await toxics.undo()
        if isinstance(exc, ToxiproxyError):
            raise FaultError(f"{description}: {exc}") from None
        raise
    names = ", ".join(link.name for link in links)
    return Injected(f"{description} on {names}", toxics.undo)


#: What a link fault does to one link (recording what it added in the _Toxics).
Action = Callable[["_Toxics", LinkInfo], Awaitable[None]]


class PartitionFault(SpecBase):
    """Cut the links from ``source`` to ``target`` (wildcards allowed)."""

    kind: Literal["partition"] = "partition"
    source: Pattern
    target: Pattern
    mode: PartitionMode = PartitionMode.BLACK_HOLE

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        links = select_links(deployment, self.source, self.target)
        mode = self.mode

        async def cut(toxics: _Toxics, link: LinkInfo) -> None:
            if mode is PartitionMode.REFUSE:
                await toxics.disable(link.name)
                return
            for stream in Direction.BOTH.streams():
                await toxics.add(
                    link.name, f"chaos-partition-{stream}", "timeout", stream, {"timeout": 0}
                )

        return await _apply(deployment, links, f"partition ({mode.value})", cut)


class LatencyFault(SpecBase):
    """Add ``latency_ms`` (± ``jitter_ms``) to the links from ``source`` to ``target``."""

    kind: Literal["latency"] = "latency"
    source: Pattern
    target: Pattern
    latency_ms: Annotated[int, Field(ge=0, le=600_000)]
    jitter_ms: Annotated[int, Field(ge=0, le=600_000)] = 0
    direction: Direction = Direction.BOTH

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        links = select_links(deployment, self.source, self.target)
        return await _apply(
            deployment,
            links,
            f"latency {self.latency_ms}±{self.jitter_ms} ms ({self.direction.value})",
            _latency(self.latency_ms, self.jitter_ms, self.direction),
        )


def _latency(latency_ms: int, jitter_ms: int, direction: Direction) -> Action:
    async def slow(toxics: _Toxics, link: LinkInfo) -> None:
        for stream in direction.streams():
            await toxics.add(
                link.name,
                f"chaos-latency-{stream}",
                "latency",
                stream,
                {"latency": latency_ms, "jitter": jitter_ms},
            )

    return slow


class AllHealthChecksFailFault(SpecBase):
    """Make every regional health probe of the global LB time out at once."""

    kind: Literal["all-health-checks-fail"] = "all-health-checks-fail"
    latency_ms: Annotated[int, Field(gt=PROBE_TIMEOUT_MS, le=600_000)] = HEALTH_FAIL_LATENCY_MS

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        links = [
            link for link in deployment.links.values() if link.kind is LinkKind.GLOBAL_REGIONAL
        ]
        if not links:
            raise UnknownTarget(
                "all-health-checks-fail needs global -> regional fault-proxy links: start "
                "the deployment with gtm up --processes --chaos-links global-regional"
            )
        return await _apply(
            deployment,
            links,
            f"all health checks fail (latency {self.latency_ms} ms > probe timeout)",
            _latency(self.latency_ms, 0, Direction.DOWNSTREAM),
        )

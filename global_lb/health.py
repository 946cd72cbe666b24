"""Active health checks of each region's regional LB, with rise/fall thresholds.

Every ``interval`` seconds each region's LB gets ``GET /healthz`` (timeout ``timeout``).
A region goes down after ``fall`` consecutive failures and comes back after ``rise``
consecutive successes (exabgp's healthcheck and gdnsd use the same rise/fall scheme; it
is what stops flapping, PowerDNS issue #7469). The first result of a region decides its
state at once, so start-up does not wait ``rise`` rounds — but until that first round
is complete the checker is not :attr:`~HealthChecker.ready`, so ``/readyz`` says no and
no answer is given on unknown health (PowerDNS #12557).

**Fail open.** When every checked region fails at once, the likeliest cause is the
checker's own network, not the whole world going dark; answering nothing would turn a
monitoring fault into a global outage. So all regions are then treated as up, logged,
and exported as ``gtm_global_health_fail_open`` 1 (Route 53 and PowerGSLB do the same:
"all down = all up").

Defaults (interval 0.5 s, timeout 0.5 s, fall 2) detect a dead LB in at most ~1.5 s —
within the 3 s failover budget of issue 7 with room for propagation. Probes cost two
requests a second per region per global replica: far below the storms of PowerDNS
#8261 (5–10 connections a second per IP).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import aiohttp
from pydantic import Field

from global_lb.metrics import GlobalMetrics
from gtm.clock import Clock
from gtm.models import Frozen

log = logging.getLogger(__name__)


class HealthCheckConfig(Frozen):
    interval: float = Field(default=0.5, gt=0.0, le=3600.0)
    #: 1 s, not 0.5: a probe from the global tier crosses continents (measured Azure RTTs
    #: reach ~300 ms, ``data/latency``) and a gray, slow-but-up control path
    #: must not evacuate a region (chaos scenario ``global-region-latency``: 600 ± 200 ms
    #: RTT). Route 53 is far more patient (4 s to connect, 2 s to answer); a region that is
    #: really gone refuses connections and is caught by ``fall`` probes well inside the
    #: 3 s failover budget (``bench/global_failover.py``).
    timeout: float = Field(default=1.0, gt=0.0, le=60.0)
    rise: int = Field(default=2, ge=1, le=100)
    fall: int = Field(default=2, ge=1, le=100)
    path: str = Field(default="/healthz", pattern=r"^/")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    detail: str = ""


class Prober(Protocol):
    """Checks one regional LB; never raises (a failure is a result)."""

    async def probe(self, url: str, /) -> ProbeResult: ...


class HttpProber:
    """``GET {url}{path}`` with a deadline; healthy on HTTP 200."""

    def __init__(self, session: aiohttp.ClientSession, config: HealthCheckConfig) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=config.timeout)
        self._path = config.path

    async def probe(self, url: str, /) -> ProbeResult:
        try:
            async with self._session.get(
                url.rstrip("/") + self._path, timeout=self._timeout, allow_redirects=False
            ) as response:
                await response.read()
                if response.status == 200:
                    return ProbeResult(True)
                return ProbeResult(False, f"HTTP {response.status}")
        except TimeoutError:
            return ProbeResult(False, "timeout")
        except aiohttp.ClientError as exc:
            return ProbeResult(False, type(exc).__name__)


@dataclass(slots=True)
class _Tracker:
    up: bool | None = None  # None until the first result
    streak: int = 0  # consecutive results disagreeing with ``up``
    detail: str = ""


@dataclass(frozen=True, slots=True)
class HealthTable:
    """The checks' verdicts at one epoch (bumped on every change)."""

    epoch: int = 0
    #: Region id → (up, detail). Regions without a checked endpoint are absent.
    status: Mapping[str, tuple[bool, str]] = field(default_factory=lambda: MappingProxyType({}))
    fail_open: bool = False

    def is_down(self, region_id: str) -> str | None:
        """Why the region is down, or ``None`` if it is up or not checked."""
        if self.fail_open:
            return None
        found = self.status.get(region_id)
        if found is None or found[0]:
            return None
        return found[1] or "health check failed"


class HealthChecker:
    """Probes a set of regional LBs; :attr:`table` holds the latest verdicts."""

    def __init__(
        self,
        prober: Prober,
        *,
        clock: Clock,
        metrics: GlobalMetrics,
        config: HealthCheckConfig | None = None,
        on_change: Callable[[HealthTable], None] | None = None,
    ) -> None:
        self._prober = prober
        self._clock = clock
        self._metrics = metrics
        self._config = config or HealthCheckConfig()
        self._targets: dict[str, str] = {}
        self._trackers: dict[str, _Tracker] = {}
        self._table = HealthTable()
        self._on_change = on_change
        self._ready = asyncio.Event()
        self._rounds = 0
        self._dirty = False

    @property
    def config(self) -> HealthCheckConfig:
        return self._config

    @property
    def table(self) -> HealthTable:
        return self._table

    @property
    def ready(self) -> bool:
        """Whether every current target has had at least one result."""
        return self._ready.is_set()

    @property
    def rounds(self) -> int:
        return self._rounds

    def set_targets(self, targets: Mapping[str, str]) -> None:
        """Region id → regional LB base URL. Regions that left are forgotten."""
        self._targets = dict(targets)
        for gone in set(self._trackers) - set(targets):
            del self._trackers[gone]
            self._dirty = True  # the next round publishes a table without it
        if any(rid not in self._trackers for rid in targets):
            self._ready.clear()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def check_once(self) -> bool:
        """Probe every target once; return whether any verdict changed."""
        targets = dict(self._targets)
        results = await asyncio.gather(*(self._prober.probe(url) for url in targets.values()))
        changed = False
        for region_id, result in zip(targets, results, strict=True):
            changed |= self._apply(region_id, result)
        self._rounds += 1
        if all(rid in self._trackers and self._trackers[rid].up is not None for rid in targets):
            self._ready.set()
        fail_open = self._all_down()
        if changed or self._dirty or fail_open != self._table.fail_open:
            self._dirty = False
            self._publish(fail_open)
            return True
        return False

    async def run(self) -> None:
        """Check forever, every ``interval``; cancel to stop."""
        while True:
            await self.check_once()
            await self._clock.sleep(self._config.interval)

    def _apply(self, region_id: str, result: ProbeResult) -> bool:
        tracker = self._trackers.setdefault(region_id, _Tracker())
        if tracker.up is None:
            tracker.up, tracker.detail = result.ok, result.detail
            self._metrics.health_changes.labels(region_id, _state(result.ok)).inc()
            return True
        if result.ok == tracker.up:
            tracker.streak = 0
            if not result.ok:
                tracker.detail = result.detail
            return False
        tracker.streak += 1
        threshold = self._config.rise if result.ok else self._config.fall
        if tracker.streak < threshold:
            return False
        tracker.up, tracker.streak, tracker.detail = result.ok, 0, result.detail
        self._metrics.health_changes.labels(region_id, _state(result.ok)).inc()
        log.warning(
            "region %s is %s (%s)", region_id, _state(result.ok), result.detail or "checks pass"
        )
        return True

    def _all_down(self) -> bool:
        trackers = [self._trackers[r] for r in self._targets if r in self._trackers]
        return len(trackers) >= 2 and all(t.up is False for t in trackers)

    def _publish(self, fail_open: bool) -> None:
        if fail_open and not self._table.fail_open:
            log.error(
                "every regional LB health check fails at once; failing open (treating all "
                "regions as up) — check the global tier's own network"
            )
        self._metrics.health_fail_open.set(1 if fail_open else 0)
        status = {
            rid: (bool(t.up), t.detail)
            for rid, t in sorted(self._trackers.items())
            if t.up is not None
        }
        self._table = HealthTable(self._table.epoch + 1, MappingProxyType(status), fail_open)
        if self._on_change is not None:
            self._on_change(self._table)


def _state(up: bool) -> str:
    return "up" if up else "down"

"""The code mutants: each replaces one named product function (see :mod:`chaos.mutants`).

Each patch imports its target and replaces it, so a renamed or removed target fails
loudly (``tests/unit/chaos/mutants`` applies every patch). A module-level function is
also rebound in every module already imported that holds it under the same name (a
package ``__init__`` that re-exported it); modules imported later bind the patched one.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

#: The global probe's timeout under ``impatient-health-checks``, s: below the 600 ms
#: round trip of the global-region-latency scenario, as a first version once had.
IMPATIENT_TIMEOUT_S = 0.25


def _replace(module_name: str, attribute: str, new: object) -> None:
    """``module.attribute = new``, and in every loaded module that bound the old one."""
    module = importlib.import_module(module_name)
    old = getattr(module, attribute)
    setattr(module, attribute, new)
    for other in list(sys.modules.values()):
        if other is not None and getattr(other, attribute, None) is old:
            setattr(other, attribute, new)


def health_checks_pass() -> None:
    """The global tier's probe of a regional LB always succeeds: no region goes down."""
    from global_lb.health import HttpProber, ProbeResult

    async def probe(self: HttpProber, url: str, /) -> ProbeResult:
        return ProbeResult(True)

    HttpProber.probe = probe  # type: ignore[method-assign]


def no_fail_open() -> None:
    """Every region failing its probes at once is believed: all are taken out."""
    from global_lb.health import HealthChecker

    def all_down(self: HealthChecker) -> bool:
        return False

    HealthChecker._all_down = all_down  # type: ignore[method-assign]


def no_failback() -> None:
    """A region the checks took down never rises again."""
    from global_lb.health import HealthChecker, ProbeResult

    original = HealthChecker._apply

    def apply(self: HealthChecker, region_id: str, result: ProbeResult) -> bool:
        tracker = self._trackers.get(region_id)
        if tracker is not None and tracker.up is False and result.ok:
            return False
        return original(self, region_id, result)

    HealthChecker._apply = apply  # type: ignore[method-assign]


def impatient_health_checks() -> None:
    """The global probe gives a regional LB :data:`IMPATIENT_TIMEOUT_S` to answer."""
    import aiohttp

    from global_lb.health import HealthCheckConfig, HttpProber

    original = HttpProber.__init__

    def init(self: HttpProber, session: aiohttp.ClientSession, config: HealthCheckConfig) -> None:
        original(self, session, config)
        self._timeout = aiohttp.ClientTimeout(total=IMPATIENT_TIMEOUT_S)

    HttpProber.__init__ = init  # type: ignore[method-assign]


def gpu_health_ignored() -> None:
    """The zone agent never ejects a GPU and believes every active check passes."""
    from zone_agent.health import HealthTracker

    original = HealthTracker.observe_check

    def observe_check(self: HealthTracker, gpu_id: str, ok: bool, now: float) -> bool:
        return original(self, gpu_id, True, now)

    def eject(self: HealthTracker, gpu: object, now: float) -> bool:
        return False

    HealthTracker.observe_check = observe_check  # type: ignore[method-assign]
    HealthTracker._eject = eject  # type: ignore[method-assign]


def scrape_round_waits_for_all() -> None:
    """The zone agent's scrape round rebuilds its view only once every worker answered:
    one silent worker holds every round to the scrape timeout, and the others' numbers
    are then too old to trust (the agent is blind to their load)."""
    from zone_agent.app import ZoneAgent

    original = ZoneAgent.scrape_round

    async def scrape_round(self: ZoneAgent, *, whole: bool = False) -> None:
        await original(self, whole=True)

    ZoneAgent.scrape_round = scrape_round  # type: ignore[method-assign]


def no_retry_before_first_byte() -> None:
    """Every tier's relay makes one attempt: a failure before the first byte is the
    client's, not retried on another GPU, zone or region."""
    from aiohttp import web

    from gtm.relay import Relay, StreamBreaks

    original = Relay.__init__

    def init(
        self: Relay[Any],
        request: web.Request,
        *,
        max_attempts: int = 3,
        breaks: StreamBreaks | None = None,
    ) -> None:
        original(self, request, max_attempts=1, breaks=breaks)

    Relay.__init__ = init  # type: ignore[method-assign]


def region_needs_every_zone() -> None:
    """A region reports itself unhealthy as soon as one of its zones is missing."""
    import regional_lb.summary
    from gtm.models import RegionSummary

    original = regional_lb.summary.build_summary

    def build_summary(*args: Any, **kwargs: Any) -> RegionSummary:
        summary = original(*args, **kwargs)
        whole = summary.zones_healthy == summary.zones_total
        return summary.model_copy(update={"healthy": summary.healthy and whole})

    _replace("regional_lb.summary", "build_summary", build_summary)


def snapshot_dropped() -> None:
    """When the state store fails, a tier forgets the fleet instead of serving its last
    snapshot (the opposite of static stability)."""
    from gtm.state.snapshot import FleetSnapshot, SnapshotWatcher

    original = SnapshotWatcher._mark_stale

    # Whatever its other arguments (its signature is the product's to change).
    async def mark_stale(self: SnapshotWatcher, *args: Any, **kwargs: Any) -> None:
        await original(self, *args, **kwargs)
        self._snapshot = FleetSnapshot(revision=self._snapshot.revision)

    SnapshotWatcher._mark_stale = mark_stale  # type: ignore[method-assign]


def watch_ends_on_compaction() -> None:
    """A watch whose revision was compacted away ends for good: no re-list, no resume;
    the tier serves the snapshot it had, never updated again."""
    import asyncio

    from gtm.errors import CompactedError
    from gtm.state.snapshot import SnapshotWatcher

    original = SnapshotWatcher._follow

    async def follow(self: SnapshotWatcher) -> None:
        try:
            await original(self)
        except CompactedError:
            await asyncio.Event().wait()

    SnapshotWatcher._follow = follow  # type: ignore[method-assign]


def no_burst_allowance() -> None:
    """Quotas quantised per second again: a tenant's burst beyond a second of its share
    is refused, although it is within its per-minute quota (issue 22: "its first burst
    of 60 requests gets 59 × 429")."""
    from regional_lb.quota import QuotaLimiter, QuotaSettings

    original = QuotaLimiter.__init__

    def init(self: QuotaLimiter, settings: QuotaSettings | None = None) -> None:
        strict = dataclasses.replace(settings or QuotaSettings(), burst_allowance=0.0)
        original(self, strict)

    QuotaLimiter.__init__ = init  # type: ignore[method-assign]


def lenient_policy_loader() -> None:
    """A policy document with unknown fields loads with those fields dropped, where the
    loader must reject it (a typo'd field silently means "not set")."""
    from pydantic import ValidationError

    import policies.loader
    from policies.documents import DOCUMENT_TYPES, Kind
    from policies.errors import PolicyValidationError
    from policies.policyset import LoadedDocument
    from policies.yamlsafe import ParsedDocument

    original = policies.loader.validate_document

    def validate_document(parsed: ParsedDocument, source: str) -> LoadedDocument:
        try:
            return original(parsed, source)
        except PolicyValidationError:
            data = parsed.data
            if not isinstance(data, dict) or data.get("kind") not in {k.value for k in Kind}:
                raise
            try:
                DOCUMENT_TYPES[Kind(data["kind"])].model_validate(data)
            except ValidationError as exc:
                for error in exc.errors():
                    if error["type"] == "extra_forbidden":
                        _drop(data, tuple(error["loc"]))
            return original(dataclasses.replace(parsed, data=data), source)

    _replace("policies.loader", "validate_document", validate_document)


def _drop(data: Any, path: tuple[int | str, ...]) -> None:
    for part in path[:-1]:
        data = data[part]
    del data[path[-1]]


#: Patch name (as the catalogue in :mod:`chaos.mutants` refers to it) → the patch.
PATCHES: Mapping[str, Callable[[], None]] = MappingProxyType(
    {
        "health-checks-pass": health_checks_pass,
        "no-fail-open": no_fail_open,
        "no-failback": no_failback,
        "impatient-health-checks": impatient_health_checks,
        "gpu-health-ignored": gpu_health_ignored,
        "scrape-round-waits-for-all": scrape_round_waits_for_all,
        "no-retry-before-first-byte": no_retry_before_first_byte,
        "region-needs-every-zone": region_needs_every_zone,
        "snapshot-dropped": snapshot_dropped,
        "watch-ends-on-compaction": watch_ends_on_compaction,
        "lenient-policy-loader": lenient_policy_loader,
        "no-burst-allowance": no_burst_allowance,
    }
)

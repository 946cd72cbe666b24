"""Builds the :class:`~global_lb.view.GlobalView` from its sources and keeps it current.

Sources, each read through a callable so tests can hand in plain values:

* the policy in force (:class:`gtm.policy_store.ActivePolicy`, hot-reloaded);
* the fleet snapshot (regions, region summaries, drains) from the state store;
* the active health checks' :class:`~global_lb.health.HealthTable`;
* the static topology (``--topology``), the layer between policy regions and the store.

:meth:`ViewKeeper.refresh` rebuilds only when one of them moved (snapshot revision,
policy generation, health epoch, staleness) and swaps the new view in with one
assignment; readers (DNS, front door) take ``keeper.view`` once per decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import yaml
from pydantic import Field, ValidationError

from global_lb.health import HealthTable
from global_lb.metrics import GlobalMetrics
from global_lb.view import (
    GlobalView,
    LatencyModel,
    RegionState,
    ViewRevision,
    jurisdiction_members,
    loads_of,
    policy_regions,
    terms_of,
)
from gtm.errors import ConfigError
from gtm.models import DrainTarget, Frozen, GeoPoint, Region, RegionSummary
from gtm.policy_store import ActivePolicy
from gtm.state.snapshot import FleetSnapshot

log = logging.getLogger(__name__)


class TopologyFile(Frozen):
    """``--topology FILE``: region records (``gtm.models.Region``) — where each region's
    regional LB listens (``endpoints``: URL and the address DNS answers carry)."""

    regions: tuple[Region, ...] = Field(default=(), max_length=10_000)


def load_topology(path: str | Path) -> tuple[Region, ...]:
    try:
        data = yaml.safe_load(Path(path).read_text("utf-8")) or {}
        return TopologyFile.model_validate(data).regions
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the topology: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            ".".join(str(p) for p in e["loc"]) + ": " + e["msg"]
            for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"{path}: invalid topology: {problems}") from None


def merged_regions(
    policy: ActivePolicy, topology: tuple[Region, ...], snapshot: FleetSnapshot
) -> dict[str, Region]:
    """Policy regions, overridden by the topology file, overridden by the store."""
    regions = policy_regions(policy)
    regions.update({r.id: r for r in topology})
    regions.update(snapshot.regions)
    return regions


def region_health(
    region_id: str,
    summary: RegionSummary | None,
    table: HealthTable,
    require_summary: bool,
) -> str:
    """Why the region is unhealthy, or "" when it is healthy."""
    down = table.is_down(region_id)
    if down is not None:
        return f"health check: {down}"
    if summary is None:
        return "no region summary (regional LB gone?)" if require_summary else ""
    if not summary.healthy:
        return "regional LB reports unhealthy"
    if summary.zones_total > 0 and summary.zones_healthy == 0:
        return "no healthy zone"
    return ""


def build_view(
    policy: ActivePolicy,
    snapshot: FleetSnapshot,
    table: HealthTable,
    *,
    topology: tuple[Region, ...] = (),
    latency: LatencyModel | None = None,
    require_summaries: bool = False,
    stale: bool = False,
) -> GlobalView:
    """One immutable view from its sources (pure)."""
    regions = merged_regions(policy, topology, snapshot)
    states: list[RegionState] = []
    for rid in sorted(regions):
        region = regions[rid]
        summary = snapshot.region_summaries.get(rid)
        why = region_health(rid, summary, table, require_summaries)
        states.append(
            RegionState(
                id=rid,
                name=region.name,
                location=region.location,
                country=region.country,
                jurisdiction=region.jurisdiction,
                endpoints=region.endpoints,
                healthy=not why,
                health_reason=why,
                drained=snapshot.is_drained(DrainTarget.REGION, rid),
                summary=summary,
                loads=(loads := loads_of(summary)),
                terms=terms_of(loads),
            )
        )
    outages = tuple(s.location for s in states if not s.available)
    if outages:
        states = [_with_outages(s, outages) for s in states]
    return GlobalView(
        revision=ViewRevision(snapshot.revision, policy.generation, table.epoch),
        regions=tuple(states),
        policy=policy,
        latency=latency or LatencyModel(),
        jurisdictions=jurisdiction_members(policy, states),
        stale=stale,
    )


def _with_outages(state: RegionState, outages: tuple[GeoPoint, ...]) -> RegionState:
    return replace(state, outages=outages)


class ViewKeeper:
    """Holds the current view; :meth:`refresh` rebuilds it when a source moved."""

    def __init__(
        self,
        *,
        policy: Callable[[], ActivePolicy | None],
        snapshot: Callable[[], FleetSnapshot],
        health: Callable[[], HealthTable],
        metrics: GlobalMetrics,
        topology: tuple[Region, ...] = (),
        latency: LatencyModel | None = None,
        require_summaries: bool = False,
        stale: Callable[[], bool] = lambda: False,
        on_regions: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        self._policy = policy
        self._snapshot = snapshot
        self._health = health
        self._metrics = metrics
        self._topology = topology
        self._latency = latency or LatencyModel()
        self._require_summaries = require_summaries
        self._stale = stale
        self._on_regions = on_regions
        self._view: GlobalView | None = None
        self._key: tuple[object, ...] | None = None
        self._targets: Mapping[str, str] = MappingProxyType({})
        self._listeners: list[Callable[[GlobalView], None]] = []

    @property
    def view(self) -> GlobalView | None:
        """The current view (``None`` until a policy is in force)."""
        return self._view

    def subscribe(self, listener: Callable[[GlobalView], None]) -> None:
        self._listeners.append(listener)

    def refresh(self) -> bool:
        """Rebuild the view if any source changed; return whether it did."""
        policy = self._policy()
        if policy is None:
            return False
        snapshot, table, stale = self._snapshot(), self._health(), self._stale()
        key = (snapshot.revision, id(snapshot), policy.generation, id(policy), table.epoch, stale)
        if key == self._key:
            return False
        view = build_view(
            policy,
            snapshot,
            table,
            topology=self._topology,
            latency=self._latency,
            require_summaries=self._require_summaries,
            stale=stale,
        )
        self._key, self._view = key, view
        self._metrics.view_revision.set(snapshot.revision)
        for region in view.regions:
            self._metrics.region_healthy.labels(region.id).set(1 if region.available else 0)
        self._update_targets(view)
        for listener in self._listeners:
            listener(view)
        return True

    def _update_targets(self, view: GlobalView) -> None:
        targets = {r.id: r.endpoints[0].url for r in view.regions if r.endpoints}
        if targets != dict(self._targets):
            self._targets = MappingProxyType(targets)
            if self._on_regions is not None:
                self._on_regions(self._targets)

"""``health-filter``: removes drained zones, zones this request already failed on, zones
whose agent URL is unknown, and unhealthy zones unless in panic.

Unhealthy: no summary (the zone agent's lease expired), a summary that says so, or no
healthy GPU with prefill capacity for the model. In Envoy's *panic* mode
(:mod:`regional_lb.priority`: too little of the region is healthy and there is nowhere
else to go) health is ignored, as Envoy balances over all hosts when a priority level is
below its panic threshold — a health signal that condemns most of a region is more
likely wrong than right. A drain is an operator's decision and always holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from gtm.models import Frozen, RouteRequest
from gtm.routing import FilterResult
from regional_lb.view import ZoneContext, ZoneState

TYPE_NAME = "health-filter"


class Params(Frozen):
    """No parameters."""


class HealthFilter:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> FilterResult[ZoneState]:
        kept: list[ZoneState] = []
        removed: list[tuple[str, str]] = []
        for zone in candidates:
            if zone.drained:
                removed.append((zone.id, "drained"))
            elif zone.id in ctx.excluded:
                removed.append((zone.id, "already failed for this request"))
            elif zone.info.url is None:
                removed.append((zone.id, "no zone agent URL (Zone record or --zone-url)"))
            elif ctx.panic or zone.healthy:
                kept.append(zone)
            elif zone.info.summary is None:
                removed.append((zone.id, "no zone summary (zone agent down?)"))
            else:
                removed.append((zone.id, f"no healthy GPU for {request.model}"))
        return FilterResult(tuple(kept), tuple(removed))

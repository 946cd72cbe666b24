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

from gtm.models import Frozen
from gtm.routing import Plugin, Removal, removal_where
from regional_lb.view import ZoneBatch

TYPE_NAME = "health-filter"


class Params(Frozen):
    """No parameters."""


class HealthFilter(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        zones, ctx, model = batch.zones, batch.ctx, batch.request.model

        def why(position: int) -> str | None:
            zone = zones[position]
            if zone.drained:
                return "drained"
            if zone.id in ctx.excluded:
                return "already failed for this request"
            if zone.info.url is None:
                return "no zone agent URL (Zone record or --zone-url)"
            if ctx.panic or zone.healthy:
                return None
            if zone.info.summary is None:
                return "no zone summary (zone agent down?)"
            return f"no healthy GPU for {model}"

        return removal_where(batch, why)

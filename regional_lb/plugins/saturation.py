"""``saturation-filter``: removes zones that are full (see :func:`regional_lb.view.
is_saturated`: running + waiting requests, corrected by what this replica sent since the
summary, past capacity plus a short queue per GPU; or the KV cache past 80 %).

The regional profile always ends with this filter (:mod:`regional_lb.profiles` appends
it when the configured profile lacks it), so "every zone is saturated" is exactly a
NoEligibleCandidate naming it — the signal for spillover or the fair queue.
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing import Plugin, Removal, removal_where
from regional_lb.view import ZoneBatch

TYPE_NAME = "saturation-filter"


class Params(Frozen):
    """No parameters."""


class SaturationFilter(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        zones = batch.zones
        if batch.ctx.panic:  # health is ignored: so is the health-scaled capacity
            return removal_where(
                batch, lambda k: "saturated" if zones[k].saturated_in_panic else None
            )
        return removal_where(batch, lambda k: "saturated" if zones[k].saturated else None)

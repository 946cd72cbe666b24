"""``saturation-filter``: removes zones that are full (see :func:`regional_lb.view.
is_saturated`: running + waiting requests, corrected by what this replica sent since the
summary, past capacity plus a short queue per GPU; or the KV cache past 80 %).

The regional profile always ends with this filter (:mod:`regional_lb.profiles` appends
it when the configured profile lacks it), so "every zone is saturated" is exactly a
NoEligibleCandidate naming it — the signal for spillover or the fair queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from gtm.models import Frozen, RouteRequest
from gtm.routing import FilterResult, partition
from regional_lb.view import ZoneContext, ZoneState

TYPE_NAME = "saturation-filter"


class Params(Frozen):
    """No parameters."""


class SaturationFilter:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> FilterResult[ZoneState]:
        if ctx.panic:  # health is ignored: so is the health-scaled capacity
            return partition(candidates, lambda z: "saturated" if z.saturated_in_panic else None)
        return partition(candidates, lambda z: "saturated" if z.saturated else None)

"""``health-filter``: keep only regions that are healthy and not drained.

Health combines the region summary the regional LB publishes under a lease (gone when
the LB dies) with the global tier's own active checks of the LB (``global_lb.health``,
rise/fall thresholds, fail-open when every check fails at once). A drained region
(``gtm drain REGION``) takes no new requests and is handed out by no DNS answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from global_lb.view import RegionState, RequestContext
from gtm.models import Frozen, RouteRequest
from gtm.routing import FilterResult

TYPE_NAME = "health-filter"


class Params(Frozen):
    """No parameters: thresholds belong to the health checker."""


class HealthFilter:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: RouteRequest, candidates: Sequence[RegionState], ctx: RequestContext, /
    ) -> FilterResult[RegionState]:
        kept = tuple([c for c in candidates if c.healthy and not c.drained])
        if len(kept) == len(candidates):
            return FilterResult(kept)
        return FilterResult(kept, tuple([(c.id, _why(c)) for c in candidates if not c.available]))


def _why(region: RegionState) -> str:
    if region.drained:
        return "drained"
    return f"unhealthy: {region.health_reason or 'failed health checks'}"

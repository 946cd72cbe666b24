"""``health-filter``: keep only regions that are healthy and not drained.

Health combines the region summary the regional LB publishes under a lease (gone when
the LB dies) with the global tier's own active checks of the LB (``global_lb.health``,
rise/fall thresholds, fail-open when every check fails at once). A drained region
(``gtm drain REGION``) takes no new requests and is handed out by no DNS answer. The
available regions are a bit mask worked out once per view (``prepare``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import ClassVar

from global_lb.batch import GlobalCap, MaskFilter, RegionBatch, bits, changed_positions
from global_lb.view import GlobalView, RegionState
from gtm.models import Frozen
from gtm.routing import Capability

TYPE_NAME = "health-filter"


class Params(Frozen):
    """No parameters: thresholds belong to the health checker."""


class HealthFilter(MaskFilter):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset(
        {GlobalCap.MASK_FILTER, GlobalCap.AVAILABILITY, Capability.PREPARE}
    )

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._last: tuple[GlobalView, int] | None = None

    def prepare(self, view: GlobalView, /) -> int:
        """The available regions (the previous view's, patched where regions changed)."""
        last = self._last
        changed = None if last is None else changed_positions(last[0], view)
        regions = view.regions
        if last is None or changed is None:
            available, changed = 0, (1 << len(regions)) - 1
        else:
            available = last[1]
        for i in bits(changed):
            region = regions[i]
            if region.healthy and not region.drained:
                available |= 1 << i
            else:
                available &= ~(1 << i)
        self._last = (view, available)
        return available

    def kept(self, batch: RegionBatch, /) -> int:
        found: int | None = batch.prepared.get(self)
        return self.prepare(batch.view) if found is None else found  # type: ignore[arg-type]

    def reason(self, batch: RegionBatch, /) -> Callable[[int], str]:
        regions = batch.regions
        return lambda i: _why(regions[i])


def _why(region: RegionState) -> str:
    if region.drained:
        return "drained"
    return f"unhealthy: {region.health_reason or 'failed health checks'}"

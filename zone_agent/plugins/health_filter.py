"""``health-filter`` (old name ``healthy-filter``): only GPUs that may take a request now.

Removes GPUs that are ejected by outlier detection, failing active health checks, not
checked yet, draining or drained by an operator, or not ``ready`` in the inventory (the
reasons come from the view). A half-open GPU — back from an ejection on trial — takes
one request at a time: it is removed while a request of ours is in flight there, the way
a circuit breaker's half-open state lets a single probe through.

Every zone profile starts with this filter (the profile refuses to build otherwise), so
no routing policy can send traffic to a GPU the agent considers unhealthy.
"""

from __future__ import annotations

from collections.abc import Callable

from gtm.models import Frozen
from gtm.routing.framework import Plugin, Removal
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.view import ModelIndex

TYPE_NAME = "health-filter"


class Params(Frozen):
    pass


class HealthFilter(Plugin):
    #: The first filter of every profile; :class:`zone_agent.fastpaths.FusedFilters`.
    capabilities = frozenset({ZoneCapability.HEALTH})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        index = batch.index
        if not index.any_half_open:
            return self.index_removal(index)
        mask = index.unavailable | (index.half_open & (batch.streams > 0))
        return Removal(mask, _reasons(index))

    def index_removal(self, index: ModelIndex, /) -> Removal | None:
        """What :meth:`removes` removes when no GPU of ``index`` is half-open: a function
        of the view alone, so the fused path works it out once per view."""
        if not index.any_unavailable:
            return None
        return Removal(index.unavailable, _reasons(index))


def _reasons(index: ModelIndex) -> Callable[[int], str]:
    def reason(i: int) -> str:
        return index.reasons[i] or "half-open: its one trial request is in flight"

    return reason


#: The class under its name before the vocabulary of issue 21.
HealthyFilter = HealthFilter

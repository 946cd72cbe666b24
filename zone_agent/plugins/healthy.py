"""``healthy-filter``: only GPUs that may take a request now.

Removes GPUs that are ejected by outlier detection, failing active health checks, not
checked yet, draining or drained by an operator, or not ``ready`` in the inventory (the
reasons come from the view). A half-open GPU — back from an ejection on trial — takes
one request at a time: it is removed while a request of ours is in flight there, the way
a circuit breaker's half-open state lets a single probe through.

Every zone profile starts with this filter (the profile refuses to build otherwise), so
no routing policy can send traffic to a GPU the agent considers unhealthy.
"""

from __future__ import annotations

from gtm.models import Frozen
from zone_agent.pipeline import Batch, Removal

TYPE_NAME = "healthy-filter"


class Params(Frozen):
    pass


class HealthyFilter:
    ensures_health = True

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def removes(self, batch: Batch, /) -> Removal | None:
        index = batch.index
        if index.any_half_open:
            mask = index.unavailable | (index.half_open & (batch.streams > 0))
        elif index.any_unavailable:
            mask = index.unavailable
        else:
            return None

        def reason(i: int) -> str:
            return index.reasons[i] or "half-open: its one trial request is in flight"

        return Removal(mask, reason)

"""``weighted-round-robin-picker`` (baseline): turns in proportion to each GPU type's speed.

Weights are the profile's prefill rate over the zone's slowest, rounded (H100 ≈ 2 per
A100's 1, per the seeds). The schedule is interleaved WRR (LVS ``wrr``): round ``r``
visits, in id order, every survivor of weight ≥ ``r``; the request's arrival number
picks its slot in the cycle — deterministic, no state between decisions.

Old type name ``weighted-round-robin``, still accepted.
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import OneHotPicker

TYPE_NAME = "weighted-round-robin-picker"


class Params(Frozen):
    pass


class WeightedRoundRobinPicker(OneHotPicker):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def choose(self, batch: ZoneBatch, /) -> int:
        alive = np.flatnonzero(batch.alive)
        weights = batch.index.wrr_weight[alive]
        rounds = np.arange(1, int(weights.max()) + 1)
        sizes = (weights[None, :] >= rounds[:, None]).sum(axis=1)
        ends = np.cumsum(sizes)
        slot = batch.request.seq % int(ends[-1])
        r = int(np.searchsorted(ends, slot, side="right"))
        offset = slot - (int(ends[r - 1]) if r else 0)
        members = alive[weights >= r + 1]
        return int(members[offset])


#: The class under its name before the vocabulary of issue 21.
WeightedRoundRobin = WeightedRoundRobinPicker

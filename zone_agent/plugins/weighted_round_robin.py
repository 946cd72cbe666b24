"""``weighted-round-robin`` (baseline): turns in proportion to each GPU type's speed.

Weights are the profile's prefill rate over the zone's slowest, rounded (H100 ≈ 2 per
A100's 1, per the seeds). The schedule is interleaved WRR (LVS ``wrr``): round ``r``
visits, in id order, every survivor of weight ≥ ``r``; the request's arrival number
picks its slot in the cycle — deterministic, no state between decisions.
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from zone_agent.pipeline import Batch
from zone_agent.plugins._arrays import one_hot
from zone_agent.view import Floats

TYPE_NAME = "weighted-round-robin"


class Params(Frozen):
    pass


class WeightedRoundRobin:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scores(self, batch: Batch, /) -> Floats:
        alive = np.flatnonzero(batch.alive)
        weights = batch.index.wrr_weight[alive]
        rounds = np.arange(1, int(weights.max()) + 1)
        sizes = (weights[None, :] >= rounds[:, None]).sum(axis=1)
        ends = np.cumsum(sizes)
        slot = batch.request.seq % int(ends[-1])
        r = int(np.searchsorted(ends, slot, side="right"))
        offset = slot - (int(ends[r - 1]) if r else 0)
        members = alive[weights >= r + 1]
        return one_hot(len(batch), int(members[offset]))

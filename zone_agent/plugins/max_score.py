"""``max-score-picker``: the survivor with the highest total; ties to the smallest id.

With the ``ttft-cost`` scorer alone that is the GPU with the lowest predicted TTFT.
Optional ``near_equal``: when several survivors are within that much total score of the
best, take the better of two drawn at random among them (power of two choices,
Mitzenmacher 2001), so that agent replicas sharing the same stale view do not all herd
onto the single "best" GPU. Draws come from the request's own random source
(``(seed, request id)``), so a decision is reproducible.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from gtm.routing.framework import uniform_index
from zone_agent.pipeline import Batch
from zone_agent.plugins._arrays import first_max_of
from zone_agent.view import Floats

TYPE_NAME = "max-score-picker"


class Params(Frozen):
    near_equal: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int = 0


class MaxScorePicker:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        p = params or Params()
        self._name = name
        self._near = p.near_equal
        self._seed = p.seed
        #: Whether it always picks the first survivor of highest total.
        self.picks_max_total = self._near <= 0.0

    @property
    def name(self) -> str:
        return self._name

    def pick(self, batch: Batch, totals: Floats, /) -> int:
        best = first_max_of(totals, batch.survivors, batch.all_alive)
        if self._near <= 0.0:
            return best
        close = np.flatnonzero(batch.alive & (totals >= totals[best] - self._near))
        if len(close) < 2:
            return best
        rng = batch.rng(self._seed)
        first = uniform_index(rng, len(close))
        second = uniform_index(rng, len(close) - 1)
        if second >= first:
            second += 1
        a, b = int(close[first]), int(close[second])
        if totals[a] != totals[b]:
            return a if totals[a] > totals[b] else b
        return min(a, b)

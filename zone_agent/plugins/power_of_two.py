"""``power-of-two-picker``: the better total of two distinct random survivors.

"The power of two choices" (Mitzenmacher, IEEE TPDS 2001): sampling two and keeping the
less loaded cuts the maximum load from Θ(log n / log log n) to Θ(log log n). The default
router of Ray Serve and the ``power_of_two`` policies of the SGLang and vLLM routers
(with a least-connections scorer, that is those baselines). Draws come from
``(seed, request id)``, as :mod:`gtm.routing.pickers.power_of_two` draws.
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from gtm.routing.framework import uniform_index
from zone_agent.pipeline import Batch
from zone_agent.view import Floats

TYPE_NAME = "power-of-two-picker"


class Params(Frozen):
    seed: int = 0


class PowerOfTwoPicker:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name
        self._seed = (params or Params()).seed

    @property
    def name(self) -> str:
        return self._name

    def pick(self, batch: Batch, totals: Floats, /) -> int:
        alive = np.flatnonzero(batch.alive)
        if len(alive) == 1:
            return int(alive[0])
        rng = batch.rng(self._seed)
        first = uniform_index(rng, len(alive))
        second = uniform_index(rng, len(alive) - 1)
        if second >= first:
            second += 1
        a, b = int(alive[first]), int(alive[second])
        if totals[a] != totals[b]:
            return a if totals[a] > totals[b] else b
        return min(a, b)

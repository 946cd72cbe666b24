"""``random-picker``: a uniformly random survivor, ignoring scores (a baseline).

The draw comes from ``(seed, request id)``, so it is reproducible per request.
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from gtm.routing.framework import uniform_index
from zone_agent.pipeline import Batch
from zone_agent.view import Floats

TYPE_NAME = "random-picker"


class Params(Frozen):
    seed: int = 0


class RandomPicker:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name
        self._seed = (params or Params()).seed

    @property
    def name(self) -> str:
        return self._name

    def pick(self, batch: Batch, totals: Floats, /) -> int:
        alive = np.flatnonzero(batch.alive)
        return int(alive[uniform_index(batch.rng(self._seed), len(alive))])

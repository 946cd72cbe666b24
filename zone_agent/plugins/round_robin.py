"""``round-robin`` (baseline): GPUs in turn, skipping those filtered out.

The request's arrival number at the agent picks position ``seq mod n`` and the first
survivor from there on (as nginx's and the SGLang/vLLM routers' ``round_robin``), as a
one-hot score for the ``max-score-picker``. Knows nothing about load or caches.
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from zone_agent.pipeline import Batch
from zone_agent.plugins._arrays import one_hot
from zone_agent.view import Floats

TYPE_NAME = "round-robin"


class Params(Frozen):
    pass


class RoundRobin:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scores(self, batch: Batch, /) -> Floats:
        n = len(batch)
        start = batch.request.seq % n
        order = np.roll(np.arange(n), -start)
        choice = int(order[np.argmax(batch.alive[order])])
        return one_hot(n, choice)

"""``round-robin-picker`` (baseline): GPUs in turn, skipping those filtered out.

The request's arrival number at the agent picks position ``seq mod n`` and the first
survivor from there on (as nginx's and the SGLang/vLLM routers' ``round_robin``).
Knows nothing about load or caches.

Old type name ``round-robin``, still accepted.
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import OneHotPicker

TYPE_NAME = "round-robin-picker"


class Params(Frozen):
    pass


class RoundRobinPicker(OneHotPicker):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def choose(self, batch: ZoneBatch, /) -> int:
        n = len(batch)
        start = batch.request.seq % n
        order = np.roll(np.arange(n), -start)
        return int(order[np.argmax(batch.alive[order])])


#: The class under its name before the vocabulary of issue 21.
RoundRobin = RoundRobinPicker

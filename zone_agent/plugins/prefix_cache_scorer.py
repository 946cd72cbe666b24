"""``prefix-cache-scorer`` (llm-d baseline): share of the prompt's blocks cached there.

llm-d's approximate ``prefix-cache-scorer``: ``matched blocks / total blocks`` of the
prompt, from the router's own routing history (our prefix index). Part of llm-d's former
default blend, weight 3 (with ``queue-scorer`` 2 and ``kv-cache-utilization-scorer`` 2).
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from zone_agent.pipeline import Batch
from zone_agent.view import Floats

TYPE_NAME = "prefix-cache-scorer"


class Params(Frozen):
    pass


class PrefixCacheScorer:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scores(self, batch: Batch, /) -> Floats:
        total = len(batch.request.prefix_hashes)
        if total == 0:
            return np.zeros(len(batch))
        return batch.matched / total

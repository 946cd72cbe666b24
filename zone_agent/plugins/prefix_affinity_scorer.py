"""``prefix-affinity-scorer`` (llm-d baseline): share of the prompt's blocks cached there.

llm-d's approximate ``prefix-cache-scorer``: ``matched blocks / total blocks`` of the
prompt, from the router's own routing history (our prefix index). Part of llm-d's former
default blend, weight 3 (with ``queue-scorer`` 2 and ``kv-cache-utilization-scorer`` 2).

Old type name ``prefix-cache-scorer``, still accepted.
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from gtm.routing.framework import Plugin
from zone_agent.batch import ZoneBatch
from zone_agent.view import Floats

TYPE_NAME = "prefix-affinity-scorer"


class Params(Frozen):
    pass


class PrefixAffinityScorer(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> Floats:
        total = len(batch.request.prefix_hashes)
        if total == 0:
            return np.zeros(len(batch))
        return batch.matched / total


#: The class under its name before the vocabulary of issue 21.
PrefixCacheScorer = PrefixAffinityScorer

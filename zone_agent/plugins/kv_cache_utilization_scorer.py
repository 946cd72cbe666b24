"""``kv-cache-utilization-scorer`` (llm-d baseline): ``1 − KV-cache usage``.

llm-d's scorer of the same name, on the usage of the last fresh scrape corrected by the
KV blocks the agent has sent since (``Batch.kv_free``).
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from zone_agent.pipeline import Batch
from zone_agent.view import Floats

TYPE_NAME = "kv-cache-utilization-scorer"


class Params(Frozen):
    pass


class KvCacheUtilizationScorer:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scores(self, batch: Batch, /) -> Floats:
        total = np.maximum(batch.index.kv_total, 1.0)
        return np.clip(batch.kv_free / total, 0.0, 1.0)

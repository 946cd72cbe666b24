"""``sglang-cache-aware-picker`` (baseline): SGLang Model Gateway's default ``cache_aware`` policy.

(sglang ``docs/advanced_features/sgl_model_gateway.md``; thresholds are its defaults.)
Load = requests the router has in flight per worker. If the load is *imbalanced* —
``max − min > balance_abs_threshold`` (64) and ``max > balance_rel_threshold`` (1.5) ×
``min`` — go to the least loaded worker. Otherwise go to the worker with the highest
prefix match if the matched fraction of the prompt is ≥ ``cache_threshold`` (0.3),
else to the worker with the smallest cache tree (fewest blocks the router sent there),
to spread new prefixes. SGLang's approximate radix tree of routed text is our prefix
index of routed blocks.

Old type name ``sglang-cache-aware``, still accepted.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import OneHotPicker, first_max, first_min

TYPE_NAME = "sglang-cache-aware-picker"


class Params(Frozen):
    cache_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    balance_abs_threshold: float = Field(default=64.0, ge=0.0)
    balance_rel_threshold: float = Field(default=1.5, ge=1.0)


class SglangCacheAwarePicker(OneHotPicker):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        p = params or Params()
        super().__init__(name)
        self._cache = p.cache_threshold
        self._abs = p.balance_abs_threshold
        self._rel = p.balance_rel_threshold

    def choose(self, batch: ZoneBatch, /) -> int:
        alive, load = batch.alive, batch.streams
        live = load[alive]
        high, low = float(live.max()), float(live.min())
        if high - low > self._abs and high > self._rel * low:
            return first_min(load, alive)
        request = batch.request
        matched_tokens = batch.matched * request.tokens_per_block
        rate = matched_tokens / request.input_tokens if request.input_tokens else matched_tokens * 0
        best = first_max(rate, alive)
        if rate[best] >= self._cache and rate[best] > 0:
            return best
        prefix = batch.view.accounting.prefix
        trees = np.array([prefix.blocks(int(s)) for s in batch.index.slots], dtype=np.float64)
        return first_min(trees, alive)


#: The class under its name before the vocabulary of issue 21.
SglangCacheAware = SglangCacheAwarePicker

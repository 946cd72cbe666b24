"""``dynamo-cost-scorer`` (baseline): NVIDIA Dynamo KV router's default linear cost, lowest wins.

(ai-dynamo/dynamo ``docs/components/router/router-concepts.md``)::

    cost = overlap_weight · max(active_prefill + incoming_prompt − overlap, 0)
         + (active_decode + incoming_prompt)

in KV blocks of the worker's block size: ``active_prefill`` = prompt tokens in flight
not yet prefilled, ``incoming_prompt`` = this request's prompt, ``overlap`` = its cached
leading blocks, ``active_decode`` = KV blocks in use. ``overlap_weight`` is
``--router-kv-overlap-score-weight`` (default 1); temperature 0 (deterministic).
Min-max normalised so the cheapest scores 1.

Old type name ``dynamo-cost``, still accepted.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from gtm.routing.framework import Plugin
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import lower_is_better
from zone_agent.view import Floats

TYPE_NAME = "dynamo-cost-scorer"


class Params(Frozen):
    overlap_weight: float = Field(default=1.0, ge=0.0)


class DynamoCostScorer(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._weight = (params or Params()).overlap_weight

    def scores(self, batch: ZoneBatch, /) -> Floats:
        index, request = batch.index, batch.request
        block = index.block_size
        incoming = request.input_tokens / block
        overlap = batch.matched * request.tokens_per_block / block
        prefill = np.maximum(batch.pending / block + incoming - overlap, 0.0)
        decode = (index.kv_total - batch.kv_free) + incoming
        return lower_is_better(self._weight * prefill + decode, batch.alive)


#: The class under its name before the vocabulary of issue 21.
DynamoCost = DynamoCostScorer

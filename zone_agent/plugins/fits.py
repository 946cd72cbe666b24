"""``fits-filter``: GPUs where the request fits — context length and KV-cache blocks.

Hard rules (a GPU that breaks one can never serve the request):

* the longest prompt plus ``max_tokens`` (or one token when not given) must fit the
  worker's maximum context length, as vLLM checks at admission;
* the request's KV blocks at admission — its prompts and one output token each, in the
  worker's block size — must fit the worker's whole KV cache.

When every candidate breaks the context rule the request is refused with
:class:`PromptTooLong`, which names the largest limit in the zone (the agent answers 400).

Soft rule: GPUs whose *free* KV blocks (last fresh scrape, minus what the agent sent
since) cannot hold the request are removed — but only if some other candidate can. When
none can, all stay: a full KV cache is a queue, not a refusal, and the cost model prices
the wait.
"""

from __future__ import annotations

import math

import numpy as np

from gtm.errors import NoEligibleCandidate
from gtm.models import Frozen
from zone_agent._np import fall, fany, fmax
from zone_agent.pipeline import Batch, Removal
from zone_agent.view import Bools, Floats

TYPE_NAME = "fits-filter"


class PromptTooLong(NoEligibleCandidate):
    """No GPU of the zone has a context window large enough for the request."""

    def __init__(self, filter_name: str, limit: int, needed: int, prompt: int) -> None:
        super().__init__(
            filter_name,
            f"this model's maximum context length is {limit} tokens; the request needs "
            f"{needed} ({prompt} in the prompt)",
        )
        self.limit = limit
        self.needed = needed
        self.prompt = prompt


class Params(Frozen):
    #: Apply the soft free-KV rule (see the module docstring).
    free_kv: bool = True


class FitsFilter:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name
        self._free_kv = (params or Params()).free_kv

    @property
    def name(self) -> str:
        return self._name

    def removes(self, batch: Batch, /) -> Removal | None:
        request, index, alive = batch.request, batch.index, batch.alive
        needed = request.max_prompt_tokens + request.output_tokens_or_one
        # KV blocks needed: a scalar when every GPU of the model has one block size.
        uniform = index.uniform_block_size
        blocks: float | Floats
        if uniform:
            blocks = most = float(math.ceil(request.input_tokens / uniform) + request.prompts)
        else:
            blocks = np.ceil(request.input_tokens / index.block_size) + request.prompts
            most = fmax(blocks)
        # Fast path: the request fits the smallest context and KV cache of the model's
        # GPUs (the usual case), so only the free-KV rule may need per-GPU work.
        hard: Bools | None = None
        if needed > index.min_max_model_len or most > index.min_kv_total:
            too_long = index.max_model_len < needed
            if fall(too_long | ~alive):
                limit = int(index.max_model_len[alive].max())
                raise PromptTooLong(self._name, limit, needed, request.max_prompt_tokens)
            hard = too_long | (index.kv_total < blocks)
        mask = hard
        short: Bools | None = None
        if self._free_kv and most > index.min_kv_free_bound - fmax(batch.kv_own):
            short = batch.kv_free < blocks
            if fany(short):
                # Survivors that have room (for booleans a > b is a & ~b).
                ok = np.greater(alive, short) if hard is None else alive & ~hard & ~short
                if fany(ok):
                    mask = short if hard is None else hard | short
        if mask is None or (mask is not short and not fany(mask)):
            return None

        def reason(i: int) -> str:
            need = int(blocks if isinstance(blocks, float) else blocks[i])
            if index.max_model_len[i] < needed:
                return f"context {int(index.max_model_len[i])} < {needed} tokens needed"
            if index.kv_total[i] < need:
                return f"KV cache of {int(index.kv_total[i])} blocks < {need} needed"
            return f"{int(batch.kv_free[i])} free KV blocks < {need} needed"

        return Removal(mask, reason)

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
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gtm.errors import NoEligibleCandidate
from gtm.models import Frozen
from gtm.routing.framework import Plugin, Removal
from zone_agent._np import fall, fany, fmax
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.costs.blend import new_floor_form
from zone_agent.request import ZoneRequest
from zone_agent.view import Bools, Floats, ModelIndex

TYPE_NAME = "fits-filter"
#: Builds a NamedTuple from its fields in C (its own ``__new__`` is a Python-level call).
_new_tuple = tuple.__new__


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


class Demand(NamedTuple):
    """What a request needs of a GPU: context tokens and KV blocks at admission."""

    #: Longest prompt plus ``max_tokens`` (or one): the context length it needs.
    needed: int
    #: KV blocks at admission: a scalar when every GPU of the model has one block size.
    blocks: float | Floats
    #: The most blocks it needs anywhere.
    most: float


def demand(request: ZoneRequest, index: ModelIndex) -> Demand:
    needed = request.max_prompt_tokens + request.output_tokens_or_one
    uniform = index.uniform_block_size
    if uniform:
        most = float(math.ceil(request.input_tokens / uniform) + request.prompts)
        return _new_tuple(Demand, (needed, most, most))
    blocks = np.ceil(request.input_tokens / index.block_size) + request.prompts
    return Demand(needed, blocks, fmax(blocks))


class FitsFilter(Plugin):
    capabilities = frozenset({ZoneCapability.FITS})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._free_kv = (params or Params()).free_kv

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        request, index, alive = batch.request, batch.index, batch.alive
        need = self.shortcut(request, index)
        if need is not None:
            return self.soft_removal(batch, need)
        need = demand(request, index)  # a hard rule may bite: per GPU
        needed, blocks = need.needed, need.blocks
        too_long = index.max_model_len < needed
        if fall(too_long | ~alive):
            limit = int(index.max_model_len[alive].max())
            raise PromptTooLong(self.name, limit, needed, request.max_prompt_tokens)
        hard: Bools = too_long | (index.kv_total < blocks)
        mask = hard
        if self._free_kv and need.most > index.min_kv_free_bound - fmax(batch.kv_own):
            short = batch.kv_free < blocks
            # Survivors that have room.
            if fany(short) and fany(alive & ~hard & ~short):
                mask = hard | short
        if not fany(mask):
            return None
        return Removal(mask, _reasons(batch, need))

    @staticmethod
    def shortcut(request: ZoneRequest, index: ModelIndex, /) -> Demand | None:
        """The request's demand when no hard rule can bite at any GPU of ``index`` (then
        :meth:`soft_removal` is all this filter does), else None. The usual case: the
        request fits the smallest context and KV cache of the model's GPUs."""
        need = demand(request, index)
        if need.needed > index.min_max_model_len or need.most > index.min_kv_total:
            return None
        return need

    def soft_removal(self, batch: ZoneBatch, need: Demand, /) -> Removal | None:
        """The free-KV rule alone (for a request no hard rule can refuse anywhere)."""
        if not self._free_kv:
            return None
        # Free KV blocks are at least ``kv_free_base − kv_own`` everywhere (what we sent
        # since the scrape is at most our whole charge: see ZoneBatch.kv_free), so where
        # that holds the request, no GPU is short: one kernel call (blend.kv_floor_numpy)
        # instead of the rule's five array operations.
        index = batch.index
        floor_of: Callable[..., float] | None = index.memo.get(new_floor_form)  # type: ignore[assignment]
        if floor_of is None:
            floor_of = index.memo[new_floor_form] = new_floor_form()
        if need.most <= floor_of(batch.view.accounting.kv_blocks, index.slots, index.kv_free_base):
            return None
        short = batch.kv_free < need.blocks
        # Survivors that have room (for booleans a > b is a & ~b).
        if fany(short) and fany(np.greater(batch.alive, short)):
            return Removal(short, _reasons(batch, need))
        return None


def _reasons(batch: ZoneBatch, need: Demand) -> Callable[[int], str]:
    index, needed, blocks = batch.index, need.needed, need.blocks

    def reason(i: int) -> str:
        want = int(blocks if isinstance(blocks, float) else blocks[i])
        if index.max_model_len[i] < needed:
            return f"context {int(index.max_model_len[i])} < {needed} tokens needed"
        if index.kv_total[i] < want:
            return f"KV cache of {int(index.kv_total[i])} blocks < {want} needed"
        return f"{int(batch.kv_free[i])} free KV blocks < {want} needed"

    return reason

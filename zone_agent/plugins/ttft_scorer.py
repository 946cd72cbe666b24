"""``ttft-scorer`` (old name ``ttft-cost``): the default scorer and cost model — the
predicted time-to-first-token in ms of :mod:`zone_agent.costs.ttft` (the formula, all
its forms), scored ``exp((best − cost) / scale_ms)`` (:mod:`zone_agent.costs.blend`).

The plugin gathers the formula's inputs from the decision's batch and memoises the
costs there, so the scorer, the cost model and the fast paths work them out once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from gtm.routing.framework import Capability, Plugin
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.costs import ttft
from zone_agent.costs.blend import best_cost, ttft_scores
from zone_agent.prefix import mask_bytes
from zone_agent.view import Floats

TYPE_NAME = "ttft-scorer"


class Params(Frozen):
    #: Extra predicted TTFT that costs a factor e of score.
    scale_ms: float = Field(default=250.0, gt=0.0)
    #: ε of the bounded-load cap on cache affinity. 0.25: HAProxy's documented example
    #: ``hash-balance-factor 125`` and Vimeo's production setting for bounded-load
    #: consistent hashing (c = 1.25).
    bounded_load_epsilon: float = Field(default=0.25, gt=0.0)
    decode_pressure: bool = True


class TtftScorer(Plugin):
    capabilities = frozenset({ZoneCapability.COST_SCORE, Capability.SCORES_IN_RANGE})

    def __init__(
        self, name: str = TYPE_NAME, params: Params | None = None, *, kernel: bool = True
    ) -> None:
        """``kernel=False``: the numpy form even where the C kernel was built (tests)."""
        p = params or Params()
        #: Makes the form a model index's decisions call, kept in the index's memo.
        self._new_form = ttft.new_form if kernel else ttft.numpy_form
        super().__init__(name)
        self.scale_ms = p.scale_ms
        self._inv_scale = 1.0 / p.scale_ms
        self._epsilon = p.bounded_load_epsilon
        self._decode = p.decode_pressure
        self._memo = f"{name}:cost"

    def costs_ms(self, batch: ZoneBatch, /) -> Floats:
        cached = batch.memo.get(self._memo)
        if cached is not None:
            return cached
        index, request = batch.index, batch.request
        acc = batch.view.accounting
        credit: ttft.Matches
        if not request.prefix_hashes:  # a prompt shorter than a block: held nowhere
            credit = []
        elif (groups := batch.match_groups) is None:
            credit = batch.matches
        else:  # many GPUs may hold the prompt: their positions as mask bytes
            credit = [(depth, mask_bytes(mask)) for depth, mask in groups] if groups else []
        scale = 0.0
        if credit:
            total = batch.streams_sum()
            scale = ttft.load_scale(self._epsilon, total, request.sequences, batch.rate_sum)
        form: Callable[..., None] | None = index.memo.get(self._new_form)  # type: ignore[assignment]
        if form is None:
            form = index.memo[self._new_form] = self._new_form()
        costs = np.empty(len(index.ids))
        form(
            costs,
            acc.pending,
            acc.streams,
            index.slots,
            index.external_queued,
            index.rate,
            index.ms_per_token,
            index.inv_max_batched,
            index.step_extra_ms,
            credit,
            float(request.input_tokens),
            request.tokens_per_block,
            float(request.sequences),
            scale,
            self._decode,
        )
        batch.memo[self._memo] = costs
        return costs

    def alone_costs_ms(self, batch: ZoneBatch, /) -> Floats:
        """Each GPU's predicted TTFT of the prompt by itself: no queue, no cache credit
        (a new array)."""
        index = batch.index
        return ttft.alone_costs_numpy(
            float(batch.request.input_tokens),
            index.ms_per_token,
            index.inv_max_batched,
            index.step_extra_ms,
            self._decode,
        )

    def own_costs_ms(self, batch: ZoneBatch, /) -> Floats:
        """Each GPU's predicted TTFT of the prompt's uncached part there by itself: its
        own share of :meth:`costs_ms` (the rest is the queue before it; a new array)."""
        index = batch.index
        return ttft.alone_costs_numpy(
            batch.uncached,
            index.ms_per_token,
            index.inv_max_batched,
            index.step_extra_ms,
            self._decode,
        )

    def own_cost_at(self, batch: ZoneBatch, position: int, uncached: float, /) -> float:
        """:meth:`own_costs_ms` at one position, for ``uncached`` tokens there (its
        ``uncached``; the same float operations, without the arrays)."""
        index = batch.index
        return ttft.cost_at(
            uncached,
            float(index.ms_per_token[position]),
            float(index.inv_max_batched[position]),
            float(index.step_extra_ms[position]),
            self._decode,
        )

    def scores(self, batch: ZoneBatch, /) -> Floats:
        costs = self.costs_ms(batch)
        best = best_cost(costs, None if batch.all_alive else batch.survivors)
        if not best < math.inf:
            return np.zeros(len(costs))
        return ttft_scores(costs, best, self._inv_scale, not batch.all_alive)


#: The class under its name before the vocabulary of issue 21.
TtftCost = TtftScorer

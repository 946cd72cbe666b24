"""``ttft-cost``: the default scorer and cost model — predicted time-to-first-token in ms.

ARCHITECTURE §2, per GPU, vectorised over the candidates (the scalar form is
:func:`gtm.routing.cost.predicted_ttft_ms`; the unit tests check they agree)::

    ttft = 1000 · (queued + own) / rate  +  decode pressure

* ``queued``: uncached prompt tokens waiting there — the agent's own in-flight requests
  not yet at their first byte, plus other clients' waiting requests seen in a fresh
  scrape (queue length × the typical prompt);
* ``own``: this request's prompt tokens minus the leading prefix blocks the agent
  recently sent there (they are in that GPU's prefix cache), so cache affinity is a
  cost term, not a mode;
* ``rate``: the profile's prefill tokens/s for that GPU type and model, times the
  health weight (slow start, throughput regression) — heterogeneous GPUs are weighted
  by what they can do;
* decode pressure: every prefill pass of ``max_num_batched_tokens`` also carries the
  running batch, whose KV reads take time beyond the pass's compute (the roofline of
  :meth:`gtm.gpu_profiles.GpuProfile.forward_time_s`), plus the fixed per-pass
  overhead: ``passes × step_extra``, with the view's ``step_extra`` from the last
  scraped KV usage.

Bounded-load stickiness: cache credit is only given where the GPU's in-flight
sequences stay within ``(1+ε)`` times its fair share of the zone's (capacity-weighted:
share ∝ prefill rate), the bound of consistent hashing with bounded loads (Mirrokni,
Thorup, Zadimoghaddam, SODA 2018; :func:`gtm.routing.cost.bounded_load_capacity`). A hot
prefix therefore spreads to a second GPU instead of piling onto one ("death spiral" of
cache-affine routers, sglang PR #14305).

Score: ``exp(-(cost - best) / scale_ms)`` (:func:`gtm.routing.cost.cost_to_score`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from zone_agent._np import fmin
from zone_agent.pipeline import Batch
from zone_agent.prefix import mask_bytes
from zone_agent.view import Floats

ttft_costs: Callable[..., None] | None
try:  # the cost array in C (setup.py builds it when it can)
    from zone_agent._blend import ttft_costs
except ImportError:  # pragma: no cover - an install without a C compiler
    ttft_costs = None

TYPE_NAME = "ttft-cost"

#: Up to this many GPUs holding part of the prompt, their cache credit is worked out one
#: float at a time; beyond, over whole arrays. A numpy operation on a small array costs
#: ~0.5–1 µs here and a Python float operation ~0.1 µs: with the five or so operations
#: per GPU, the two cost about the same near 16 GPUs (bench/zone_decision.py, 1,000 GPUs
#: with ~60 holding a shared system prompt: p50 ~270 µs one at a time, ~115–145 µs with
#: arrays).
SPARSE_MAX = 16


class Params(Frozen):
    #: Extra predicted TTFT that costs a factor e of score.
    scale_ms: float = Field(default=250.0, gt=0.0)
    #: ε of the bounded-load cap on cache affinity. 0.25: HAProxy's documented example
    #: ``hash-balance-factor 125`` and Vimeo's production setting for bounded-load
    #: consistent hashing (c = 1.25).
    bounded_load_epsilon: float = Field(default=0.25, gt=0.0)
    decode_pressure: bool = True


class TtftCost:
    scores_in_range = True  # exp of a non-positive number
    #: Scores fall strictly with cost, as :class:`zone_agent.pipeline.CheapestPick` needs.
    fused_role = "cost-score"

    def __init__(
        self,
        name: str = TYPE_NAME,
        params: Params | None = None,
        *,
        sparse_max: int = SPARSE_MAX,
        kernel: bool = True,
    ) -> None:
        p = params or Params()
        self._sparse_max = sparse_max
        #: The C kernel (zone_agent/_blend.c), when it was built and ``kernel`` is set.
        self._kernel = ttft_costs if kernel else None
        self._name = name
        self.scale_ms = p.scale_ms
        self._inv_scale = 1.0 / p.scale_ms
        self._epsilon = p.bounded_load_epsilon
        self._decode = p.decode_pressure
        self._memo = f"{name}:cost"

    @property
    def name(self) -> str:
        return self._name

    def costs_ms(self, batch: Batch, /) -> Floats:
        cached = batch.memo.get(self._memo)
        if cached is not None:
            return cached
        index, request = batch.index, batch.request
        kernel = self._kernel
        if kernel is not None:
            # The numpy operations below in one pass (~10 array operations of ~1 µs each
            # at 100 GPUs, a quarter of a decision), to the bit (test_blend_kernel.py).
            acc = batch.view.accounting
            groups = batch.match_groups
            credit: Mapping[int, int] | list[tuple[int, bytes]]
            if groups is None:
                credit = batch.matches
            else:  # many GPUs may hold the prompt: their positions as mask bytes
                credit = [(depth, mask_bytes(mask)) for depth, mask in groups]
            costs = np.empty(len(index.ids))
            kernel(
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
                self._load_scale(batch) if credit else 0.0,
                self._decode,
            )
            batch.memo[self._memo] = costs
            return costs
        matches = batch.matches
        if len(matches) > self._sparse_max:
            tokens = batch.queued + self._bounded_uncached_array(batch)
        else:
            queued = batch.queued
            tokens = queued + float(request.input_tokens)
            if matches:
                # Few GPUs hold part of the prompt: correct just those, one float at a
                # time (the same operations as ``queued + uncached`` over the array).
                self._credit(batch, matches, queued, tokens)
        costs = tokens * index.ms_per_token
        if self._decode:
            passes = np.multiply(tokens, index.inv_max_batched, out=tokens)
            np.ceil(passes, out=passes)
            passes *= index.step_extra_ms
            costs += passes
        batch.memo[self._memo] = costs
        return costs

    def _load_scale(self, batch: Batch) -> float:
        """Sequences per unit of prefill rate a GPU may hold and keep cache credit:
        ``(1+ε) × (in-flight sequences + this request's) / Σ rate``, over the survivors."""
        total = batch.streams_sum()
        return (1.0 + self._epsilon) * (total + batch.request.sequences) / max(batch.rate_sum, 1e-9)

    def _bounded_uncached_array(self, batch: Batch) -> Floats:
        """Uncached tokens per candidate, cache credit only where the cap allows (the
        array form of :meth:`_bounded_uncached`, for many GPUs holding the prompt)."""
        request = batch.request
        over = batch.streams + request.sequences > np.ceil(
            self._load_scale(batch) * batch.index.rate
        )
        # Where no prefix matched, uncached is already the whole prompt: no need to mask.
        return np.where(over, float(request.input_tokens), batch.uncached)

    def _credit(
        self, batch: Batch, matches: Mapping[int, int], queued: Floats, tokens: Floats
    ) -> None:
        """Give the GPUs holding part of the prompt their cache credit in ``tokens``
        (``queued + the whole prompt``), where the bounded-load cap allows it.

        The scalar form of :meth:`_bounded_uncached_array`, for the usual handful of
        GPUs: Python floats (``.item``: no numpy scalar each), the same IEEE operations
        in the same order, so the results are the array form's to the bit. A GPU over
        the cap keeps the whole prompt, which ``tokens`` already holds.
        """
        request, index = batch.request, batch.index
        sequences = request.sequences
        scale = self._load_scale(batch)
        # Our streams read at each GPU's slot: no gather of the whole column.
        streams, slot = batch.view.accounting.streams.item, index.slots.item
        rate, queued_at = index.rate.item, queued.item
        prompt, per_block = request.input_tokens, request.tokens_per_block
        ceil = math.ceil
        for position, blocks in matches.items():
            if streams(slot(position)) + sequences <= ceil(scale * rate(position)):
                # Batch.uncached_tokens, inline (this loop is on every cache hit).
                tokens[position] = queued_at(position) + max(0.0, prompt - blocks * per_block)

    def scores(self, batch: Batch, /) -> Floats:
        costs = self.costs_ms(batch)
        if batch.all_alive:
            best = fmin(costs)
        else:
            live = costs[batch.survivors]
            best = fmin(live) if len(live) else math.inf
        if not best < math.inf:
            return np.zeros(len(costs))
        # exp(-(cost - best) / scale): 1 for the best, 0 for an infinite cost. A removed
        # candidate may cost less than the best: its exponent is clamped to 0 (its score
        # is ignored; exp of a large positive number would overflow).
        exponent = np.subtract(best, costs)
        exponent *= self._inv_scale
        if not batch.all_alive:
            np.minimum(exponent, 0.0, out=exponent)
        return np.exp(exponent, out=exponent)

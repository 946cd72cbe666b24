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

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from zone_agent._np import fmin
from zone_agent.pipeline import Batch
from zone_agent.view import Floats

TYPE_NAME = "ttft-cost"


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

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        p = params or Params()
        self._name = name
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
        batch.matched  # noqa: B018 (computing it sets any_match)
        if not batch.any_match:
            tokens = batch.queued + float(request.input_tokens)
        else:
            tokens = batch.queued + self._bounded_uncached(batch)
        costs = tokens * index.ms_per_token
        if self._decode:
            costs += np.ceil(tokens * index.inv_max_batched) * index.step_extra_ms
        batch.memo[self._memo] = costs
        return costs

    def _bounded_uncached(self, batch: Batch) -> Floats:
        """Uncached tokens, with cache credit only where the bounded-load cap allows.

        Only GPUs holding part of the prompt get credit, so only they are checked.
        """
        index, alive, request = batch.index, batch.alive, batch.request
        uncached = batch.uncached
        streams = batch.streams
        if batch.all_alive:
            rate_sum, total = index.rate_sum, float(streams.sum())
        else:
            rate_sum, total = float(index.rate @ alive), float(streams @ alive)
        total += request.sequences
        scale = (1.0 + self._epsilon) * total / max(rate_sum, 1e-9)
        over = [
            int(i)
            for i in np.flatnonzero(batch.matched)
            if streams[i] + request.sequences > math.ceil(scale * index.rate[i])
        ]
        if not over:
            return uncached
        capped = uncached.copy()
        capped[over] = float(request.input_tokens)
        return capped

    def scores(self, batch: Batch, /) -> Floats:
        costs = self.costs_ms(batch)
        live = costs if batch.all_alive else np.where(batch.alive, costs, np.inf)
        best = fmin(live)
        if not best < np.inf:
            return np.zeros(len(costs))
        # exp(-(cost - best) / scale): 1 for the best, 0 for an infinite cost.
        return np.exp((best - costs) * self._inv_scale)

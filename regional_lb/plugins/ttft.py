"""The regional TTFT cost, in one module: its one form (scalar, per zone — a region has
a handful of zones, so there is no vectorised or inlined copy; spillover prices a peer's
own prefill with :func:`prefill_ms` from here), and the ``ttft-scorer`` /
``ttft-cost-model`` plugin that ranks and prices zones with it.

The cost (ARCHITECTURE §2), in ms::

    intra-region RTT to the zone              ~2 ms (regional_lb.rtt)
  + the cheaper of two ways to start (:func:`gtm.routing.cost.prefill_options`,
    shared with the global tier; what we sent since the summary takes the free GPUs
    first, fastest first):
      at once on its fastest free GPU (nothing waiting to prefill there):
        this request's *uncached* prompt tokens / that GPU's prefill rate;
      after its queue (incl. what we sent since its summary):
        queued prefill tokens / zone prefill rate
        + the uncached prompt tokens / one GPU at the zone's average rate

"Uncached" subtracts the leading prefix blocks the zone's sketch holds (prefix-sketch
locality): a zone that has the prompt's system prompt hot prefills less. Scores are
``exp(-(cost − best) / scale_ms)`` over the surviving zones
(:func:`gtm.routing.cost.scores_from_costs`). The same object is the profile's cost
model, so ``Decision.predicted_ttft_ms`` is the choice's; the costs, which do not depend
on the parameters, are worked out once per decision (``ZoneBatch.memo``) however many
instances read them.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from gtm.models import Frozen, RegionSummary, RouteRequest
from gtm.routing import Capability, Plugin
from gtm.routing.cost import (
    PrefillTerms,
    matching_prefix_blocks,
    prefill_options,
    prefill_terms,
    scores_from_costs,
)
from regional_lb.view import ZoneBatch, ZoneContext, ZoneState

TYPE_NAME = "ttft-scorer"
COST_MODEL_TYPE_NAME = "ttft-cost-model"

#: 200 ms of extra predicted TTFT costs a factor e: zones of one region differ by their
#: queues, and a queue a fifth of a second longer is worth avoiding when another zone is
#: idle, while a few ms of prefill difference is not.
DEFAULT_SCALE_MS = 200.0

#: The memo key of a decision's costs.
_COSTS = "ttft-costs"


class Params(Frozen):
    scale_ms: float = Field(default=DEFAULT_SCALE_MS, gt=0.0, le=1e6, allow_inf_nan=False)


def uncached_tokens(request: RouteRequest, zone: ZoneState, ctx: ZoneContext) -> float:
    """The request's prompt tokens the zone's hot prefixes do not cover."""
    if not request.prefix_hashes or not zone.info.sketch or ctx.tokens_per_block <= 0.0:
        return float(request.input_tokens)
    hit = matching_prefix_blocks(request.prefix_hashes, zone.info.sketch)
    return max(0.0, request.input_tokens - hit * ctx.tokens_per_block)


def prefill_ms(tokens: float, healthy_gpus: int, prefill_tokens_per_s: float) -> float:
    """One request's prefill: it runs on one GPU, at the rate of ``healthy_gpus`` GPUs
    summing ``prefill_tokens_per_s`` (a :class:`~gtm.routing.cost.PrefillTerms`' class,
    or a whole zone or region). Also the own-prefill term of a peer's TTFT
    (:func:`regional_lb.spill.peer_ttft_ms`)."""
    return 1000.0 * tokens * healthy_gpus / prefill_tokens_per_s


def zone_options(zone: ZoneState) -> tuple[PrefillTerms, ...]:
    """The ways a request can start at the zone (:func:`gtm.routing.cost.
    prefill_options`: on its fastest free GPU, after its pooled backlog); ``queue_ms``
    is ∞ when it cannot serve the model now."""
    load = zone.load
    if load is None:
        return (PrefillTerms(math.inf, 0, 0.0),)
    return prefill_options(load, zone.unseen_requests, zone.unseen_tokens)


def peer_terms(summary: RegionSummary, model: str) -> PrefillTerms:
    """A peer region's line for ``model`` from its summary (:func:`gtm.routing.cost.
    prefill_terms`): the GPUs a spilled request would prefill on (``queue_ms``: the
    region's own, without its zones' RTT)."""
    load = summary.load_for(model)
    if load is None:
        return PrefillTerms(math.inf, 0, 0.0)
    return prefill_terms(load)


def predicted_ttft_ms(zone: ZoneState, own_uncached_tokens: float) -> float:
    """Intra-region RTT + the zone's queueing + this request's prefill on the GPU that
    takes it: the cheaper way to start there (a handful of zones: the exact minimum)."""
    rtt = zone.info.rtt_ms
    best = math.inf
    for queue_ms, gpus, rate in zone_options(zone):
        if math.isinf(queue_ms):
            return math.inf
        cost = rtt + queue_ms + prefill_ms(own_uncached_tokens, gpus, rate)
        if cost < best:
            best = cost
    return best


class TtftScorer(Plugin):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset(
        {Capability.SCORES_IN_RANGE}
    )  # exp of a non-positive number, or 0

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._scale = (params or Params()).scale_ms

    def costs_ms(self, batch: ZoneBatch, /) -> list[float]:
        """Every zone's predicted TTFT (inf: it cannot serve the model now)."""
        found = batch.memo.get(_COSTS)
        if found is None:
            request, ctx = batch.request, batch.ctx
            found = batch.memo[_COSTS] = [
                predicted_ttft_ms(zone, uncached_tokens(request, zone, ctx)) for zone in batch.zones
            ]
        costs: list[float] = found  # type: ignore[assignment]
        return costs

    def scores(self, batch: ZoneBatch, /) -> list[float]:
        costs, ids = self.costs_ms(batch), batch.ids
        survivors = batch.survivors.tolist()
        scored = scores_from_costs({ids[k]: costs[k] for k in survivors}, self._scale)
        column = [0.0] * len(costs)
        for k in survivors:
            column[k] = scored[ids[k]]
        return column

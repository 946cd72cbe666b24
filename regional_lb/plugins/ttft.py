"""``ttft-scorer`` / ``ttft-cost-model``: predicted time-to-first-token at each zone.

The regional tier's cost (ARCHITECTURE §2), in ms::

    intra-region RTT to the zone              ~2 ms (regional_lb.rtt)
  + queued prefill tokens / zone prefill rate   (its queue, incl. what we sent since
                                                 its summary)
  + this request's *uncached* prompt tokens / one GPU's prefill rate

"Uncached" subtracts the leading prefix blocks the zone's sketch holds (prefix-sketch
locality): a zone that has the prompt's system prompt hot prefills less. Scores are
``exp(-(cost − best) / scale_ms)`` (:func:`gtm.routing.cost.scores_from_costs`). The same
object is the profile's cost model, so ``Decision.predicted_ttft_ms`` is the choice's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import Field

from gtm.models import Frozen, RouteRequest
from gtm.routing.cost import matching_prefix_blocks, scores_from_costs
from regional_lb.view import ZoneContext, ZoneState, predicted_ttft_ms

TYPE_NAME = "ttft-scorer"
COST_MODEL_TYPE_NAME = "ttft-cost-model"

#: 200 ms of extra predicted TTFT costs a factor e: zones of one region differ by their
#: queues, and a queue a fifth of a second longer is worth avoiding when another zone is
#: idle, while a few ms of prefill difference is not.
DEFAULT_SCALE_MS = 200.0


class Params(Frozen):
    scale_ms: float = Field(default=DEFAULT_SCALE_MS, gt=0.0, le=1e6, allow_inf_nan=False)


def uncached_tokens(request: RouteRequest, zone: ZoneState, ctx: ZoneContext) -> float:
    """The request's prompt tokens the zone's hot prefixes do not cover."""
    if not request.prefix_hashes or not zone.info.sketch or ctx.tokens_per_block <= 0.0:
        return float(request.input_tokens)
    hit = matching_prefix_blocks(request.prefix_hashes, zone.info.sketch)
    return max(0.0, request.input_tokens - hit * ctx.tokens_per_block)


class TtftScorer:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name
        self._scale = (params or Params()).scale_ms

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> Mapping[str, float]:
        return scores_from_costs(self.costs_ms(request, candidates, ctx), self._scale)

    def costs_ms(
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> dict[str, float]:
        """:meth:`cost_ms` of every candidate, by id. The same operations in the same
        order (so the same floats), inlined: the regional tier scores every request."""
        tokens = request.input_tokens
        whole = float(tokens)
        hashes = request.prefix_hashes
        per_block = ctx.tokens_per_block
        credit = bool(hashes) and per_block > 0.0
        costs: dict[str, float] = {}
        for zone in candidates:
            load = zone.load
            if load is None or load.prefill_tokens_per_s <= 0.0 or load.healthy_gpus == 0:
                costs[zone.id] = math.inf
                continue
            info = zone.info
            own = whole
            if credit and info.sketch:
                hit = matching_prefix_blocks(hashes, info.sketch)
                own = max(0.0, tokens - hit * per_block)
            rate = load.prefill_tokens_per_s
            queued = load.queued_prefill_tokens + zone.unseen_tokens
            costs[zone.id] = (
                info.rtt_ms + 1000.0 * queued / rate + 1000.0 * own * load.healthy_gpus / rate
            )
        return costs

    def cost_ms(self, request: RouteRequest, candidate: ZoneState, ctx: ZoneContext, /) -> float:
        return predicted_ttft_ms(candidate, uncached_tokens(request, candidate, ctx))

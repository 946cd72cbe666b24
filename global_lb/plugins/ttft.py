"""``ttft-scorer`` / ``ttft-cost-model``: predicted time-to-first-token at each region.

The global tier's cost (ARCHITECTURE §2), in ms::

    RTT client → region                      measured map, else 26 ms + 0.0143 ms/km
  + queued prefill tokens / region prefill rate          (the region's queueing delay)
  + this request's prompt tokens / one GPU's prefill rate     (its own prefill)

A region without a summary (nothing published yet) costs its RTT alone; a summary that
lacks the model, or a region with no prefill capacity, costs ∞. Scores are
``exp(-(cost − best) / scale_ms)``: 1 for the cheapest region, 1/e per ``scale_ms`` of
extra predicted TTFT (:func:`gtm.routing.cost.scores_from_costs`). The same object is
the profile's cost model, so ``Decision.predicted_ttft_ms`` is the choice's cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import Field

from global_lb.view import RegionState, RequestContext
from gtm.models import Frozen, RouteRequest
from gtm.routing.cost import scores_from_costs

TYPE_NAME = "ttft-scorer"
COST_MODEL_TYPE_NAME = "ttft-cost-model"

#: Default score scale: 100 ms of extra TTFT costs a factor e. About the RTT between
#: neighbouring continents' regions (US east ↔ EU west is ~75 ms P50 in the Azure
#: data), so a region one ocean away must be that much less loaded to win.
DEFAULT_SCALE_MS = 100.0


class Params(Frozen):
    scale_ms: float = Field(default=DEFAULT_SCALE_MS, gt=0.0, le=1e6, allow_inf_nan=False)


class TtftScorer:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name
        self._scale = (params or Params()).scale_ms

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: RouteRequest, candidates: Sequence[RegionState], ctx: RequestContext, /
    ) -> Mapping[str, float]:
        rtts = ctx.rtts()
        costs = {c.id: self._cost(request, c, rtts.get(c.id), ctx) for c in candidates}
        return scores_from_costs(costs, self._scale)

    def cost_ms(
        self, request: RouteRequest, candidate: RegionState, ctx: RequestContext, /
    ) -> float:
        return self._cost(request, candidate, None, ctx)

    @staticmethod
    def _cost(
        request: RouteRequest, candidate: RegionState, rtt: float | None, ctx: RequestContext
    ) -> float:
        if rtt is None:
            rtt = ctx.rtt_ms(candidate)
        if candidate.summary is None:
            return rtt
        terms = candidate.terms.get(request.model)
        if terms is None:
            return math.inf
        # The request is prefilled on one GPU: ms_per_token is the region's rate over its
        # healthy GPUs (ModelTerms); queue_ms is ∞ where nothing can prefill.
        return rtt + terms.queue_ms + request.input_tokens * terms.ms_per_token

"""``load-scorer``: prefer regions with headroom.

Score = the region's unused running-sequence capacity for the model, in [0, 1]
(:meth:`RegionState.headroom`; waiting requests count as used). A small weight next to
``ttft-scorer`` breaks near-ties toward the emptier region before queues build up, which
TTFT alone only sees once prefill tokens are already waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from global_lb.view import RegionState, RequestContext
from gtm.models import Frozen, RouteRequest

TYPE_NAME = "load-scorer"


class Params(Frozen):
    """No parameters."""


class LoadScorer:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: RouteRequest, candidates: Sequence[RegionState], ctx: RequestContext, /
    ) -> Mapping[str, float]:
        model = request.model
        return {c.id: c.headroom(model) for c in candidates}

"""``model-filter``: keep only regions that serve the requested model.

A region serves a model when its summary lists it with at least one healthy GPU. A
region without a summary (no regional LB has published one yet: a static topology) is
kept — its catalogue is unknown, and the regional LB answers 404 if it lacks the model.
DNS decisions name no model (:data:`~global_lb.view.ANY_MODEL`) and pass every region.
"""

from __future__ import annotations

from collections.abc import Sequence

from global_lb.view import ANY_MODEL, RegionState, RequestContext
from gtm.models import Frozen, RouteRequest
from gtm.routing import FilterResult

TYPE_NAME = "model-filter"


class Params(Frozen):
    """No parameters."""


class ModelFilter:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: RouteRequest, candidates: Sequence[RegionState], ctx: RequestContext, /
    ) -> FilterResult[RegionState]:
        model = request.model
        if model == ANY_MODEL:
            return FilterResult(tuple(candidates))
        kept = tuple([c for c in candidates if _serves(c, model)])
        if len(kept) == len(candidates):
            return FilterResult(kept)
        why = f"does not serve model {model!r}"
        return FilterResult(kept, tuple([(c.id, why) for c in candidates if not _serves(c, model)]))


def _serves(region: RegionState, model: str) -> bool:
    if region.summary is None:
        return True
    terms = region.terms.get(model)
    return terms is not None and terms.serves

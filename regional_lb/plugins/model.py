"""``model-filter``: keeps zones whose summary lists GPUs for the request's model."""

from __future__ import annotations

from collections.abc import Sequence

from gtm.models import Frozen, RouteRequest
from gtm.routing import FilterResult, partition
from regional_lb.view import ZoneContext, ZoneState

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
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> FilterResult[ZoneState]:
        return partition(
            candidates, lambda z: None if z.serves_model else f"does not serve {request.model}"
        )

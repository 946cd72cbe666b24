"""``kv-cache-scorer``: the zone's free share of KV-cache blocks for the model (llm-d's
kv-cache-utilization scorer, ``1 − KV%``, over a zone)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gtm.models import Frozen, RouteRequest
from regional_lb.view import ZoneContext, ZoneState

TYPE_NAME = "kv-cache-scorer"


class Params(Frozen):
    """No parameters."""


class KvCacheScorer:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> Mapping[str, float]:
        return {c.id: c.kv_free_fraction() for c in candidates}

"""``load-scorer``: unused running capacity of the zone, ``1 − utilisation`` (queued
requests count as used, and so do requests this replica sent since the summary)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gtm.models import Frozen, RouteRequest
from regional_lb.view import ZoneContext, ZoneState

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
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> Mapping[str, float]:
        return {c.id: 1.0 - c.utilisation() for c in candidates}

"""``residency-filter`` at the regional tier: a zone is in this region, so every zone is
allowed exactly when residency allows the region for this request — all or nothing.

Normally the service refuses a request whose residency excludes this region before zone
choice (451); the filter keeps the profile honest on its own: a profile that runs it can
never place a request in a region its verdict excludes (it fails closed).
"""

from __future__ import annotations

from collections.abc import Sequence

from gtm.models import Frozen, RouteRequest
from gtm.routing import FilterResult
from regional_lb.view import ZoneContext, ZoneState

TYPE_NAME = "residency-filter"


class Params(Frozen):
    """No parameters."""


class ResidencyFilter:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> FilterResult[ZoneState]:
        if ctx.allowed is None or ctx.region in ctx.allowed:
            return FilterResult(tuple(candidates))
        reason = f"residency does not allow region {ctx.region}"
        return FilterResult((), tuple((c.id, reason) for c in candidates))

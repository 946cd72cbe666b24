"""``residency-filter``: keep only the regions residency allows for this request.

The allowed set is computed before the decision by the policies engine (per tenant,
data class, model and client country for a request; per client country for a DNS
answer) and handed over in :attr:`RequestContext.allowed`. An empty set removes every
region and the profile refuses: residency fails closed. Every global-tier profile must
run this filter (``global_lb.profiles`` refuses one that does not).
"""

from __future__ import annotations

from collections.abc import Sequence

from global_lb.view import RegionState, RequestContext
from gtm.models import Frozen, RouteRequest
from gtm.routing import FilterResult

TYPE_NAME = "residency-filter"


class Params(Frozen):
    """No parameters: the policy files decide."""


class ResidencyFilter:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: RouteRequest, candidates: Sequence[RegionState], ctx: RequestContext, /
    ) -> FilterResult[RegionState]:
        allowed = ctx.allowed
        kept = tuple([c for c in candidates if c.id in allowed])
        if len(kept) == len(candidates):
            return FilterResult(kept)
        why = "residency: not an allowed region"
        if ctx.residency_rule:
            why = f"residency: not allowed by rule {ctx.residency_rule!r}"
        return FilterResult(kept, tuple([(c.id, why) for c in candidates if c.id not in allowed]))

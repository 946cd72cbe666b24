"""``residency-filter``: keep only the regions residency allows for this request.

The allowed set is computed before the decision by the policies engine (per tenant,
data class, model and client country for a request; per client country for a DNS
answer) and handed over in :attr:`RequestContext.allowed`. An empty set removes every
region and the profile refuses: residency fails closed. Every global-tier profile must
run this filter (``global_lb.profiles`` refuses one that does not).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import ClassVar

from global_lb.batch import GlobalCap, MaskFilter, RegionBatch
from gtm.models import Frozen

TYPE_NAME = "residency-filter"


class Params(Frozen):
    """No parameters: the policy files decide."""


class ResidencyFilter(MaskFilter):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset(
        {GlobalCap.MASK_FILTER, GlobalCap.RESIDENCY}
    )

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def kept(self, batch: RegionBatch, /) -> int:
        return batch.layout.allowed_mask(batch.allowed)

    def reason(self, batch: RegionBatch, /) -> Callable[[int], str]:
        rule = batch.rule
        why = (
            f"residency: not allowed by rule {rule!r}"
            if rule
            else "residency: not an allowed region"
        )
        return lambda _: why

"""``model-filter``: keep only regions that serve the requested model.

A region serves a model when its summary lists it with at least one healthy GPU. A
region without a summary (no regional LB has published one yet: a static topology) is
kept — its catalogue is unknown, and the regional LB answers 404 if it lacks the model.
DNS decisions name no model (:data:`~global_lb.view.ANY_MODEL`) and pass every region.
The serving regions are a bit mask per model, worked out once per view (``prepare``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import ClassVar

from global_lb.batch import GlobalCap, MaskFilter, PerModel, RegionBatch, bits
from global_lb.view import ANY_MODEL, GlobalView, RegionState
from gtm.models import Frozen
from gtm.routing import Capability

TYPE_NAME = "model-filter"


class Params(Frozen):
    """No parameters."""


class ModelFilter(MaskFilter):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset(
        {GlobalCap.MASK_FILTER, GlobalCap.SERVES_MODEL, Capability.PREPARE}
    )

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._last: PerModel[bool, int] | None = None

    def prepare(self, view: GlobalView, /) -> PerModel[bool, int]:
        found = self._last = PerModel(view, serves, _mask, self._last, _patched)
        return found

    def kept(self, batch: RegionBatch, /) -> int:
        model = batch.model
        if model == ANY_MODEL:
            return batch.layout.full
        prepared: PerModel[bool, int] | None = batch.prepared.get(self)
        if prepared is None:
            prepared = self.prepare(batch.view)  # type: ignore[arg-type]
        return prepared.get(model)

    def reason(self, batch: RegionBatch, /) -> Callable[[int], str]:
        why = f"does not serve model {batch.model!r}"
        return lambda _: why


def serves(region: RegionState, model: str) -> bool:
    if region.summary is None or model == ANY_MODEL:
        return True
    terms = region.terms.get(model)
    return terms is not None and terms.serves


def _patched(mask: int, entries: tuple[bool, ...], changed: int) -> int:
    for i in bits(changed):
        mask = mask | 1 << i if entries[i] else mask & ~(1 << i)
    return mask


def _mask(entries: tuple[bool, ...]) -> int:
    mask = 0
    for i, served in enumerate(entries):
        if served:
            mask |= 1 << i
    return mask

"""``load-scorer``: prefer regions with headroom.

Score = the region's unused running-sequence capacity for the model, in [0, 1]
(:meth:`RegionState.headroom`; waiting requests count as used). A small weight next to
``ttft-scorer`` breaks near-ties toward the emptier region before queues build up, which
TTFT alone only sees once prefill tokens are already waiting. The column is worked out
once per view and model (``prepare``).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import ClassVar

import numpy as np

from global_lb.batch import GlobalCap, PerModel, RegionBatch, gather
from global_lb.view import GlobalView, RegionState
from gtm.models import Frozen
from gtm.routing import Capability, Plugin
from gtm.routing.framework import Floats

TYPE_NAME = "load-scorer"


class Params(Frozen):
    """No parameters."""


class LoadScorer(Plugin):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset(
        {
            Capability.PREPARE,
            Capability.SCORES_IN_RANGE,
            GlobalCap.SURVIVOR_SCORES,
            GlobalCap.HEADROOM_SCORE,
        }
    )

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._last: PerModel[float, tuple[float, ...]] | None = None

    def prepare(self, view: GlobalView, /) -> PerModel[float, tuple[float, ...]]:
        found = self._last = PerModel(view, _headroom, tuple, self._last)
        return found

    def headroom(self, batch: RegionBatch, /) -> tuple[float, ...]:
        """Every position's headroom for the batch's model."""
        prepared: PerModel[float, tuple[float, ...]] | None = batch.prepared.get(self)
        if prepared is None:
            prepared = self.prepare(batch.view)  # type: ignore[arg-type]
        return prepared.get(batch.model)

    def scores(self, batch: RegionBatch, /) -> Floats:
        return np.array(self.headroom(batch), dtype=np.float64)

    def survivor_scores(self, batch: RegionBatch, positions: Sequence[int], /) -> list[float]:
        return gather(self.headroom(batch), positions)


def _headroom(region: RegionState, model: str) -> float:
    return region.headroom(model)

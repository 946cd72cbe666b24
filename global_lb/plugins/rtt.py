"""``rtt-scorer``: the nearest region, by the client's round trip alone.

Score = ``exp(-(rtt − best) / scale_ms)`` over the survivors (the core's
:func:`gtm.routing.cost.scores_from_costs`): 1 for the region with the shortest round
trip to the client, by the view's latency model (the measured map, else the distance
formula; :meth:`global_lb.view.LatencyModel.row`). It reads no load: a profile scoring
with it alone, after the residency, health and model filters, sends every client to the
nearest region its residency allows, as a GeoDNS latency record or the cross-region rule
of the simulator's zone-agent baselines does (:func:`fleetsim.baselines.base.
nearest_allowed`). That profile is :data:`global_lb.profiles.NEAREST_REQUEST_PROFILE`
(``gtm global --profile global-nearest``), so a live comparison runs those baselines as
the simulator does.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import ClassVar

import numpy as np
from pydantic import Field

from global_lb.batch import RegionBatch
from global_lb.plugins.ttft import DEFAULT_SCALE_MS, scores_column
from global_lb.view import GlobalView
from gtm.models import Frozen
from gtm.routing import Capability, Plugin
from gtm.routing.framework import Floats

TYPE_NAME = "rtt-scorer"


class Params(Frozen):
    scale_ms: float = Field(default=DEFAULT_SCALE_MS, gt=0.0, le=1e6, allow_inf_nan=False)


class RttScorer(Plugin):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({Capability.SCORES_IN_RANGE})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._scale = (params or Params()).scale_ms

    def rtts(self, batch: RegionBatch, positions: Sequence[int], /) -> tuple[float, ...]:
        """The client's round trips to the regions at ``positions``, in their order."""
        view: GlobalView = batch.view  # type: ignore[assignment]
        return view.latency.row(
            view.signature, view.regions, batch.point, batch.country, tuple(positions)
        )

    def scores(self, batch: RegionBatch, /) -> Floats:
        positions = tuple(batch.survivors.tolist())
        column = np.zeros(len(batch), dtype=np.float64)
        if positions:
            ids = batch.ids
            rtts = self.rtts(batch, positions)
            column[list(positions)] = scores_column([ids[i] for i in positions], rtts, self._scale)
        return column

"""``slo-picker``: picks for goodput at a TTFT SLO — the survivor of highest total (as
``max-score-picker``) while some GPU can answer within the SLO, and, when every GPU is
late because of its queue, the one where the lateness already is (within a cap), so the
others drain and meet the SLO again (:mod:`zone_agent.costs.slo`, the rule and its
reasons). The profile ``goodput`` is the default's plugins under this picker.

It reads the profile's cost model (which must declare
:attr:`~zone_agent.batch.ZoneCapability.COST_SCORE`: ``ttft-scorer``) and each GPU's
slow-start ramp, so its predictions are absolute: slow start is a preference, not a
slower GPU. ``when_late: spread`` turns the rule off (the default profile's choice,
for side-by-side runs and an operator's way back without editing the profile).

Under a zone-wide burst this trades the tail for goodput: late requests wait up to
``late_cap_ms`` instead of everyone waiting a little over the SLO.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from gtm.errors import PluginError
from gtm.models import Frozen
from gtm.routing.framework import Capability, Floats, Plugin, capabilities_of
from gtm.routing.pickers.max_score import best_of
from gtm.slo import TTFT_SLO_MS
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.costs import slo

TYPE_NAME = "slo-picker"


class LatePlacement(StrEnum):
    """Where a request goes when every GPU is predicted later than the TTFT SLO."""

    #: Where the lateness already is (the highest prediction within the cap).
    CONCENTRATE = "concentrate"
    #: Where the scores say, as ``max-score-picker`` (the lateness spreads).
    SPREAD = "spread"


class Params(Frozen):
    #: The TTFT bound of the goodput SLO (the default profile's TTFT scale).
    ttft_slo_ms: float = Field(default=TTFT_SLO_MS, gt=0.0)
    #: The longest predicted TTFT a late request is sent to wait.
    late_cap_ms: float = Field(default=10_000.0, gt=0.0)
    when_late: LatePlacement = LatePlacement.CONCENTRATE

    @model_validator(mode="after")
    def _cap_above_slo(self) -> Params:
        if self.late_cap_ms < self.ttft_slo_ms:
            raise ValueError(
                f"late_cap_ms ({self.late_cap_ms:g}) must be at least ttft_slo_ms "
                f"({self.ttft_slo_ms:g})"
            )
        return self


class SloPicker(Plugin):
    capabilities = frozenset({Capability.READS_COST_MODEL, ZoneCapability.PICKS_MAX_TOTAL_ON_TIME})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        p = params or Params()
        self.slo_ms = p.ttft_slo_ms
        self.cap_ms = p.late_cap_ms
        self.when_late = p.when_late
        self._model: Any = None

    def bind_cost_model(self, model: object, /) -> None:
        if ZoneCapability.COST_SCORE not in capabilities_of(model):
            raise PluginError(
                f"{self.name!r} needs a cost model that predicts TTFT (ttft-scorer); "
                f"{getattr(model, 'name', model)!r} does not"
            )
        self._model = model

    def late_choice(self, batch: ZoneBatch, /) -> int:
        """The rule's choice, or :data:`~zone_agent.costs.slo.NO_CHOICE` (-1): the
        highest total decides."""
        if self.when_late is LatePlacement.SPREAD:
            return slo.NO_CHOICE
        model = self._model
        costs = model.costs_ms(batch)
        ramp = batch.index.ramp
        survivors = None if batch.all_alive else batch.survivors
        if not slo.is_late_numpy(costs, ramp, survivors, self.slo_ms):
            return slo.NO_CHOICE  # the usual case: one cheap test
        alone = model.alone_costs_ms(batch)
        return slo.late_choice_numpy(costs, alone, ramp, survivors, self.slo_ms, self.cap_ms)

    def pick(self, batch: ZoneBatch, totals: Floats, /) -> int:
        choice = self.late_choice(batch)
        return choice if choice >= 0 else best_of(batch, totals)

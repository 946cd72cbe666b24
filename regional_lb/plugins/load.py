"""``load-scorer``: unused running capacity of the zone, ``1 − utilisation`` (queued
requests count as used, and so do requests this replica sent since the summary)."""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing import Plugin
from regional_lb.view import ZoneBatch

TYPE_NAME = "load-scorer"


class Params(Frozen):
    """No parameters."""


class LoadScorer(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> list[float]:
        return [1.0 - zone.utilisation() for zone in batch.zones]

"""``kv-cache-scorer``: the zone's free share of KV-cache blocks for the model (llm-d's
kv-cache-utilization scorer, ``1 − KV%``, over a zone)."""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing import Plugin
from regional_lb.view import ZoneBatch

TYPE_NAME = "kv-cache-scorer"


class Params(Frozen):
    """No parameters."""


class KvCacheScorer(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> list[float]:
        return [zone.kv_free_fraction() for zone in batch.zones]

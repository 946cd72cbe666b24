"""``kv-cache-scorer`` (llm-d baseline): ``1 − KV-cache usage``.

llm-d's scorer of the same name, on the usage of the last fresh scrape corrected by the
KV blocks the agent has sent since (``ZoneBatch.kv_free``).

Old type name ``kv-cache-utilization-scorer``, still accepted.
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing.framework import Capability, Plugin
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.costs.blend import room
from zone_agent.view import Floats

TYPE_NAME = "kv-cache-scorer"


class Params(Frozen):
    pass


class KvCacheScorer(Plugin):
    capabilities = frozenset({ZoneCapability.KV_ROOM, Capability.SCORES_IN_RANGE})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> Floats:
        return room(batch.kv_free, batch.index.inv_kv_total)


#: The class under its name before the vocabulary of issue 21.
KvCacheUtilizationScorer = KvCacheScorer

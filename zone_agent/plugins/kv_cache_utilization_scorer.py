"""``kv-cache-utilization-scorer`` (llm-d baseline): ``1 − KV-cache usage``.

llm-d's scorer of the same name, on the usage of the last fresh scrape corrected by the
KV blocks the agent has sent since (``Batch.kv_free``).
"""

from __future__ import annotations

from gtm.models import Frozen
from zone_agent.costs.blend import room
from zone_agent.pipeline import Batch
from zone_agent.view import Floats

TYPE_NAME = "kv-cache-utilization-scorer"


class Params(Frozen):
    pass


class KvCacheUtilizationScorer:
    #: In [0, 1] by construction (clamped): the runner skips its range check.
    scores_in_range = True
    #: Its place in :class:`zone_agent.pipeline.BlendPick` (the default profile).
    fused_role = "kv-room"

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scores(self, batch: Batch, /) -> Floats:
        return room(batch.kv_free, batch.index.inv_kv_total)

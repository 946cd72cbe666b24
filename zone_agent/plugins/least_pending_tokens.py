"""``least-pending-tokens`` (baseline): fewest prompt tokens waiting for prefill.

Token load instead of request count (llm-d's ``token-load-scorer``, Dynamo's prefill
blocks): the agent's own not-yet-prefilled prompt tokens plus other clients' queue from
a fresh scrape. Unlike ``ttft-cost`` it ignores prefix caches and GPU speed.
"""

from __future__ import annotations

from gtm.models import Frozen
from zone_agent.pipeline import Batch
from zone_agent.plugins._arrays import lower_is_better
from zone_agent.view import Floats

TYPE_NAME = "least-pending-tokens"


class Params(Frozen):
    pass


class LeastPendingTokens:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scores(self, batch: Batch, /) -> Floats:
        return lower_is_better(batch.queued, batch.alive)

"""``least-pending-tokens-scorer`` (baseline): fewest prompt tokens waiting for prefill.

Token load instead of request count (llm-d's ``token-load-scorer``, Dynamo's prefill
blocks): the agent's own not-yet-prefilled prompt tokens plus other clients' queue from
a fresh scrape. Unlike ``ttft-cost`` it ignores prefix caches and GPU speed.

Old type name ``least-pending-tokens``, still accepted.
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing.framework import Plugin
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import lower_is_better
from zone_agent.view import Floats

TYPE_NAME = "least-pending-tokens-scorer"


class Params(Frozen):
    pass


class LeastPendingTokensScorer(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> Floats:
        return lower_is_better(batch.queued, batch.alive)


#: The class under its name before the vocabulary of issue 21.
LeastPendingTokens = LeastPendingTokensScorer

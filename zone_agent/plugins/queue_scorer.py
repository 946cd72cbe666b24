"""``queue-scorer`` (llm-d baseline): shortest waiting queue, min-max normalised.

llm-d's ``queue-scorer`` reads ``WaitingQueueSize`` from the workers' metrics. Here:
the waiting count of the last fresh scrape, corrected by the requests the agent has sent
since (its own not-yet-started requests now minus those at scrape time).
"""

from __future__ import annotations

import numpy as np

from gtm.models import Frozen
from gtm.routing.framework import Plugin
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import lower_is_better
from zone_agent.view import Floats

TYPE_NAME = "queue-scorer"


class Params(Frozen):
    pass


class QueueScorer(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> Floats:
        index = batch.index
        queue = np.maximum(0.0, index.waiting + batch.prefilling - index.own_prefilling_at_scrape)
        return lower_is_better(queue, batch.alive)

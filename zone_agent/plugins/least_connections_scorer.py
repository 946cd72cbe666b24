"""``least-connections-scorer`` (baseline): fewest requests in flight from this agent.

nginx's ``least_conn`` and Envoy's least-request balancer count only what the proxy
itself sent, as here (the agent's in-flight sequences). Min-max normalised, so the
GPU with the fewest scores 1; ties go to the smallest id. With the
``power-of-two-picker`` it is the ``power_of_two`` baseline of the SGLang/vLLM routers.

Old type name ``least-connections``, still accepted.
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing.framework import Plugin
from zone_agent.batch import ZoneBatch
from zone_agent.plugins._arrays import lower_is_better
from zone_agent.view import Floats

TYPE_NAME = "least-connections-scorer"


class Params(Frozen):
    pass


class LeastConnectionsScorer(Plugin):
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> Floats:
        return lower_is_better(batch.streams, batch.alive)


#: The class under its name before the vocabulary of issue 21.
LeastConnections = LeastConnectionsScorer

"""``least-connections`` (baseline): fewest requests in flight from this agent.

nginx's ``least_conn`` and Envoy's least-request balancer count only what the proxy
itself sent, as here (the agent's in-flight sequences). Min-max normalised, so the
GPU with the fewest scores 1; ties go to the smallest id. With the
``power-of-two-picker`` it is the ``power_of_two`` baseline of the SGLang/vLLM routers.
"""

from __future__ import annotations

from gtm.models import Frozen
from zone_agent.pipeline import Batch
from zone_agent.plugins._arrays import lower_is_better
from zone_agent.view import Floats

TYPE_NAME = "least-connections"


class Params(Frozen):
    pass


class LeastConnections:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def scores(self, batch: Batch, /) -> Floats:
        return lower_is_better(batch.streams, batch.alive)

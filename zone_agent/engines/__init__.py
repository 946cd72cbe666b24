"""Engine plugins: one module per inference engine, each a table of its metric names.

``zone_agent.scrape`` reads every engine's names in one pass over a worker's
``/metrics`` and keeps the flavour whose names it saw most (see ``scrape.parse_metrics``).
The order of ``ENGINES`` breaks ties: an engine's own names before a wrapper's.
ARCHITECTURE §7 tables which names each engine gives for each figure, and which it lacks.
"""

from __future__ import annotations

from zone_agent.engines.base import ConfigInfo, EngineNames, Flavor, LabelledFamily, Row
from zone_agent.engines.dynamo import DYNAMO
from zone_agent.engines.llamacpp import LLAMACPP
from zone_agent.engines.sglang import SGLANG
from zone_agent.engines.tgi import TGI
from zone_agent.engines.trtllm import TRTLLM
from zone_agent.engines.vllm import VLLM

#: Every engine, its own names before a wrapper's (Dynamo passes its backend's through).
ENGINES: tuple[EngineNames, ...] = (VLLM, SGLANG, TGI, TRTLLM, LLAMACPP, DYNAMO)

__all__ = ["ENGINES", "ConfigInfo", "EngineNames", "Flavor", "LabelledFamily", "Row"]

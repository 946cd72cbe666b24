"""``prefix-affinity-scorer``: the share of the prompt's leading prefix blocks that the
zone's hot-prefix sketch holds (0 without a sketch or a fingerprint).

The TTFT cost already credits cached tokens; this scorer adds a separate, bounded pull
toward the zone that has the prompt's prefix hot (its weight is configuration), like
llm-d's prefix-cache scorer. Only leading blocks are in zone sketches, so it mostly
rewards a shared system prompt.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from gtm.models import Frozen
from gtm.routing import Capability, Plugin
from gtm.routing.cost import matching_prefix_blocks
from regional_lb.view import ZoneBatch

TYPE_NAME = "prefix-affinity-scorer"


class Params(Frozen):
    """No parameters."""


class PrefixAffinityScorer(Plugin):
    #: Scores are a share of the prompt's blocks.
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({Capability.SCORES_IN_RANGE})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def scores(self, batch: ZoneBatch, /) -> list[float]:
        blocks = batch.request.prefix_hashes
        if not blocks:
            return [0.0] * len(batch)
        return [matching_prefix_blocks(blocks, z.info.sketch) / len(blocks) for z in batch.zones]

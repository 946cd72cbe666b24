"""``prefix-affinity-scorer``: the share of the prompt's leading prefix blocks that the
zone's hot-prefix sketch holds (0 without a sketch or a fingerprint).

The TTFT cost already credits cached tokens; this scorer adds a separate, bounded pull
toward the zone that has the prompt's prefix hot (its weight is configuration), like
llm-d's prefix-cache scorer. Only leading blocks are in zone sketches, so it mostly
rewards a shared system prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gtm.models import Frozen, RouteRequest
from gtm.routing.cost import matching_prefix_blocks
from regional_lb.view import ZoneContext, ZoneState

TYPE_NAME = "prefix-affinity-scorer"


class Params(Frozen):
    """No parameters."""


class PrefixAffinityScorer:
    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def score(
        self, request: RouteRequest, candidates: Sequence[ZoneState], ctx: ZoneContext, /
    ) -> Mapping[str, float]:
        blocks = request.prefix_hashes
        if not blocks:
            return dict.fromkeys((c.id for c in candidates), 0.0)
        return {
            c.id: matching_prefix_blocks(blocks, c.info.sketch) / len(blocks) for c in candidates
        }

"""``prefix-affinity-scorer``: the share of the prompt's leading prefix blocks that the
zone's hot-prefix sketch holds (0 without a sketch or a fingerprint).

The TTFT cost already credits cached tokens; this scorer adds a separate, bounded pull
toward the zone that has the prompt's prefix hot (its weight is configuration), like
llm-d's prefix-cache scorer. Only leading blocks are in zone sketches, so it mostly
rewards a shared system prompt.

**Where a prefix was just sent** (:func:`sticky_zone`). Sketches arrive with the zone
summaries, about once a second, and hold a zone's hottest leading blocks only: the
second turn of a conversation, sent right after the first, is invisible in them. The
regional LB therefore remembers which zone it dispatched each prompt's blocks to
(:class:`gtm.routing.placement.PlacementMemory`, updated at dispatch), and the recalled
zone replaces the profile's choice when it can take the request — healthy, not drained,
serving the model, not saturated (the saturation filter's rule, with this replica's
unseen charges), not a zone the request already failed on — and its predicted TTFT with
the recalled prefix credited is no worse than the choice's. Affinity so yields to load
as SGLang's cache-aware policy does when the load is imbalanced. A zone summary
published after the conversation's previous turn was sent still counts that turn in its
queue, and its GPU as not free, when it was prefilling then: the home zone is priced
without it, its GPU free again (:func:`gtm.routing.cost.without_turn`; the client sent
the next turn after the answer). When the capacity split draws a request for a peer
region, a request whose prefix this region holds stays (:meth:`ZoneMemory.keep_local`):
the split should send away the cold requests, which cost the region's headroom most.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from enum import StrEnum
from typing import ClassVar

from gtm.models import Frozen, RouteRequest
from gtm.routing import Capability, Plugin
from gtm.routing.cost import matching_prefix_blocks, without_turn
from gtm.routing.placement import PlacementMemory, Recall
from regional_lb.plugins.ttft import predicted_ttft_ms
from regional_lb.view import ZoneBatch, ZoneState

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


def sticky_zone(
    recall: Recall | None,
    chosen: ZoneState,
    zones: tuple[ZoneState, ...],
    request: RouteRequest,
    *,
    tokens_per_block: float,
    excluded: frozenset[str] = frozenset(),
) -> ZoneState:
    """The zone for ``request``: the recalled one (where its prefix was last sent) when
    it can take it and pays for itself, else ``chosen`` (the profile's).

    ``zones``: the decision's candidates (:func:`regional_lb.view.zone_candidates`, with
    the replica's unseen charges); ``recall.at`` is on the zone summaries' clock (wall
    time live, simulated time in the simulator). Sans-io: reads its arguments alone."""
    if recall is None or recall.target == chosen.id or recall.target in excluded:
        return chosen
    home = next((z for z in zones if z.id == recall.target), None)
    if (
        home is None
        or home.saturated
        or home.drained
        or not home.healthy
        or not home.serves_model
        or home.info.url is None
    ):
        return chosen
    per_block = max(0.0, tokens_per_block)
    blocks = request.prefix_hashes
    warm = max(recall.blocks, matching_prefix_blocks(blocks, home.info.sketch))
    cold = matching_prefix_blocks(blocks, chosen.info.sketch) if blocks else 0
    tokens = float(request.input_tokens)
    summary, load = home.info.summary, home.load
    priced = home
    if (
        recall.tokens
        and summary is not None
        and load is not None
        and summary.published_at >= recall.at
    ):
        # The zone's summary was taken after the conversation's last turn was sent there
        # and counts that turn in its queue, on a GPU not free, if it was prefilling
        # then; the client sends the next turn after the answer, so it no longer is:
        # its tokens leave the queue and its GPU (the one holding the prefix) is free.
        priced = replace(home, load=without_turn(load, recall.tokens))
    home_ms = predicted_ttft_ms(priced, max(0.0, tokens - warm * per_block))
    chosen_ms = predicted_ttft_ms(chosen, max(0.0, tokens - cold * per_block))
    return home if home_ms <= chosen_ms else chosen


class ZoneMemory:
    """The regional LB's part of stickiness: its :class:`PlacementMemory` of zones and
    :func:`sticky_zone` over it. :meth:`place` is called when a request is handed to a
    zone (the LB's local relay, the simulator's regional tier): it returns the zone to
    send it to and remembers it."""

    __slots__ = ("memory",)

    def __init__(self, memory: PlacementMemory | None = None) -> None:
        self.memory = memory if memory is not None else PlacementMemory()

    def place(
        self,
        chosen: ZoneState,
        request: RouteRequest,
        zones: Callable[[], tuple[ZoneState, ...]],
        *,
        tokens_per_block: float,
        now: float,
        movable: bool = True,
    ) -> ZoneState:
        """``chosen``: the profile's zone; ``zones``: the decision's candidates (asked
        for only when the recall names another zone); ``movable``: False when the
        request is already charged to ``chosen`` (the fair queue placed it), which is
        then only remembered."""
        hashes = request.prefix_hashes
        if not hashes:
            return chosen
        memory = self.memory
        zone = chosen
        recall = memory.recall(hashes, now) if movable else None
        if recall is not None and recall.target != chosen.id:
            zone = sticky_zone(recall, chosen, zones(), request, tokens_per_block=tokens_per_block)
        memory.remember(hashes, zone.id, now, request.input_tokens)
        return zone

    def keep_local(
        self,
        request: RouteRequest,
        local: Callable[[], ZoneState | None],
        zones: Callable[[], tuple[ZoneState, ...]],
        *,
        tokens_per_block: float,
        now: float,
    ) -> ZoneState | None:
        """The zone of this region that keeps ``request`` although the capacity split
        drew it for a peer (a *degraded* spill), or ``None``: it spills.

        The split sends the demand the region's headroom cannot take to its peers; a
        request whose prefix is cached here costs that headroom little, so the cold
        requests are the ones to send away. It stays when its recalled zone is the one
        :func:`sticky_zone` keeps against ``local`` (the profile's choice among the
        zones that can take it now, ``None`` when none can). Never for a drained region
        or saturated zones: those spills are not drawn."""
        hashes = request.prefix_hashes
        recall = self.memory.recall(hashes, now) if hashes else None
        if recall is None:
            return None
        chosen = local()
        if chosen is None:
            return None
        kept = sticky_zone(recall, chosen, zones(), request, tokens_per_block=tokens_per_block)
        return kept if kept.id == recall.target else None

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
zone replaces the profile's choice when it can hold the request (:func:`can_hold`),
is not a zone the request already failed on, and its predicted TTFT with the recalled
prefix credited is no worse than the choice's. Affinity so yields to load as SGLang's
cache-aware policy does when the load is imbalanced. A zone summary published after
the conversation's previous turn was sent still counts that turn in its queue, and its
GPU as not free, when it was prefilling then: the home zone is priced without it, its
GPU free again (:func:`gtm.routing.cost.without_turn`; the client sent the next turn
after the answer). When the capacity split draws a request for a peer region, a
request whose prefix this region holds stays (:meth:`ZoneMemory.keep_local`): the split
should send away the cold requests, which cost the region's headroom most.

**A home full only by its KV cache use still holds its conversations**
(:func:`can_hold`). The saturation filter calls a zone full when its running and
waiting requests reach its limit, or when its KV cache use passes the detector's
threshold. The second is no reason to send a repeat elsewhere: the blocks of the
prefix it would reuse are resident and counted in that use, so it adds only its
uncached part, while another zone (or a peer region) allocates and prefills the whole
prompt again — KV room and prefill time that an overloaded fleet takes from every
other request. Its queue is priced by the TTFT comparison, as any zone's. A zone full
by its request count, unhealthy, drained or without GPUs for the model holds none.
When no zone can take a request (every one saturated), the home that can hold it keeps
it (:meth:`ZoneMemory.hold`) rather than the request spilling or queueing cold; a
request the capacity split drew for a peer still leaves then (the region is past its
capacity: the draw stands unless a zone can take the request now).
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
    it can hold it and pays for itself, else ``chosen`` (the profile's).

    ``zones``: the decision's candidates (:func:`regional_lb.view.zone_candidates`, with
    the replica's unseen charges); ``recall.at`` is on the zone summaries' clock (wall
    time live, simulated time in the simulator). Sans-io: reads its arguments alone."""
    if recall is None or recall.target == chosen.id or recall.target in excluded:
        return chosen
    home = next((z for z in zones if z.id == recall.target), None)
    if home is None or not can_hold(home):
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
    held = recall.held_tokens(request.input_tokens, len(blocks), per_block, warm)
    home_ms = predicted_ttft_ms(priced, max(0.0, tokens - held))
    chosen_ms = predicted_ttft_ms(chosen, max(0.0, tokens - cold * per_block))
    return home if home_ms <= chosen_ms else chosen


def can_hold(home: ZoneState) -> bool:
    """Whether ``home``, the zone a request's prefix was last sent to, may take it:
    healthy, not drained, serving the model, with an agent URL, and not saturated but
    by its KV cache use alone (``kv_bound``: the prefix's blocks are counted in that
    use; see the module docstring)."""
    return (
        (not home.saturated or home.kv_bound)
        and not home.drained
        and home.healthy
        and home.serves_model
        and home.info.url is not None
    )


def _home(recall: Recall, zones: tuple[ZoneState, ...]) -> ZoneState | None:
    """The recalled zone among ``zones`` when it can hold the request."""
    home = next((z for z in zones if z.id == recall.target), None)
    return home if home is not None and can_hold(home) else None


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
        zones that can take it now, ``None`` when none can: then the draw stands).
        Never for a drained region: those spills are not drawn."""
        hashes = request.prefix_hashes
        recall = self.memory.recall(hashes, now) if hashes else None
        if recall is None:
            return None
        chosen = local()
        if chosen is None:
            return None
        kept = sticky_zone(recall, chosen, zones(), request, tokens_per_block=tokens_per_block)
        return kept if kept.id == recall.target else None

    def hold(
        self, request: RouteRequest, zones: tuple[ZoneState, ...], *, now: float
    ) -> ZoneState | None:
        """The zone that keeps ``request`` when no zone of the region can take it now
        (every one saturated: it would spill or queue), or ``None``: the zone its
        prefix was last sent to, when that zone can hold it (:func:`can_hold`: full by
        its KV cache use alone, which the prefix's resident blocks are part of)."""
        hashes = request.prefix_hashes
        recall = self.memory.recall(hashes, now) if hashes else None
        return None if recall is None else _home(recall, zones)

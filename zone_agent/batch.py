"""The zone's data layout for the core runner: a decision's candidates by position.

The contracts are those of :mod:`gtm.routing` (README there); the runner is
:class:`gtm.routing.runner.Runner`. What is the zone's own is the layout: candidates are
positions in the model's :class:`~zone_agent.view.ModelIndex` (in id order), a filter
returns a boolean mask, a scorer a float array, and the per-candidate columns plugins
read (our in-flight charges, prefix matches, uncached and queued tokens, free KV
blocks) are worked out on first use and shared by every plugin of the decision
(:class:`ZoneBatch`). Plugins declare what fast paths may rely on as
:class:`ZoneCapability` values on their class (:mod:`zone_agent.fastpaths`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from gtm.routing.framework import NOTHING_PREPARED, Batch
from zone_agent.costs.blend import free_blocks
from zone_agent.prefix import set_bits
from zone_agent.request import ZoneRequest
from zone_agent.view import Floats, Ints, ModelIndex, ZoneView


class ZoneCapability(StrEnum):
    """What a zone plugin class offers the zone's fast paths (``capabilities``)."""

    #: Removes every GPU that may not take a request now; the first filter of every
    #: profile. ``index_removal(index)``: its removal when no GPU is half-open.
    HEALTH = "health"
    #: ``index_removal(index)``: its removal, a function of the view alone.
    MODEL = "model"
    #: ``shortcut(request, index)`` and ``soft_removal(batch, need)``: the free-KV rule
    #: alone when no hard rule can bite.
    FITS = "fits"
    #: ``idle(request, index)``: whether it surely removes nothing.
    CANARY = "canary"
    #: ``costs_ms(batch)`` and ``scale_ms``: scores ``exp((best − cost) / scale_ms)``,
    #: falling strictly with the cost; ``alone_costs_ms(batch)``: the prompt's cost with
    #: no queue and no cache credit.
    COST_SCORE = "cost-score"
    #: The KV-room score of :mod:`zone_agent.costs.blend`.
    KV_ROOM = "kv-room"
    #: A picker whose ``late_choice(batch)`` names a survivor or answers -1, and which
    #: otherwise takes the survivor of highest total (``slo-picker``).
    PICKS_MAX_TOTAL_ON_TIME = "picks-max-total-on-time"


class StreamsHint(NamedTuple):
    """Where the survivors' streams are in the accounting (worked out once per view)."""

    #: The survivors' accounting slots.
    slots: Ints
    #: The accounting's other slots, when it had ``slot_count`` slots (None: many).
    outside: tuple[int, ...] | None
    slot_count: int


class ZoneBatch(Batch):
    """One decision's working data: the request, the view, the model's index (positions
    are the index's, in id order), and per-candidate columns worked out on first use
    and shared by every plugin of the decision.

    Loads are copies of the agent's charges, taken when first read.
    """

    __slots__ = (
        "_grouped",
        "_groups",
        "_kv_free",
        "_kv_own",
        "_matched",
        "_matches",
        "_pending",
        "_prefilling",
        "_queued",
        "_rate_sum",
        "_streams",
        "_streams_hint",
        "_uncached",
        "index",
        "memo",
    )

    #: The index lists its GPUs by id: the first of tied positions is the smallest id.
    ids_ascending = True

    view: ZoneView
    request: ZoneRequest

    def __init__(self, request: ZoneRequest, view: ZoneView, index: ModelIndex) -> None:
        # Batch.__init__'s fields, set here (one call less per decision; a test checks
        # that every slot is set). The mask is the index's shared read-only one: the
        # runner replaces a batch's mask, never writes it.
        self.ids = index.ids
        self.request = request
        self.view = view
        self.alive = index.all_true
        self.all_alive = True
        self._survivors = None
        self.prepared = NOTHING_PREPARED
        self.index = index
        #: Where the survivors' streams are in the accounting, when a fast path knows.
        self._streams_hint: StreamsHint | None = None
        #: Arrays a plugin computed for this decision, for the others (e.g. TTFT costs,
        #: used by the scorer and the cost model).
        self.memo: dict[str, Floats] = {}
        self._pending: Floats | None = None
        self._streams: Floats | None = None
        self._kv_own: Floats | None = None
        self._prefilling: Floats | None = None
        self._matched: Floats | None = None
        self._matches: dict[int, int] | None = None
        #: Whether :attr:`match_groups` was worked out (``_groups``: its value).
        self._grouped = False
        self._groups: list[tuple[int, int]] | None = None
        self._uncached: Floats | None = None
        self._queued: Floats | None = None
        self._kv_free: Floats | None = None
        self._rate_sum: float | None = None

    @property
    def pending(self) -> Floats:
        """Our uncached prompt tokens in flight and not yet prefilled, per candidate."""
        if self._pending is None:
            self._pending = self.view.accounting.pending[self.index.slots]
        return self._pending

    @property
    def streams(self) -> Floats:
        """Our sequences in flight, per candidate."""
        if self._streams is None:
            self._streams = self.view.accounting.streams[self.index.slots]
        return self._streams

    @property
    def kv_own(self) -> Floats:
        if self._kv_own is None:
            self._kv_own = self.view.accounting.kv_blocks[self.index.slots]
        return self._kv_own

    @property
    def prefilling(self) -> Floats:
        if self._prefilling is None:
            self._prefilling = self.view.accounting.prefilling[self.index.slots]
        return self._prefilling

    @property
    def matches(self) -> Mapping[int, int]:
        """Position → leading prefix blocks of the request it recently got from us, for
        the candidates holding at least one (usually none or a few: kept sparse)."""
        if self._matches is None:
            groups = self.match_groups
            if groups is not None:
                # PrefixIndex.match's order: shallowest first, lowest position first.
                self._matches = {}
                for depth, mask in groups:
                    self._matches.update(dict.fromkeys(set_bits(mask), depth))
            elif self.request.prefix_hashes:
                hits = self.view.accounting.prefix.match(self.request.prefix_hashes)
                where = self.index.position_of_slot.get
                self._matches = {
                    position: blocks
                    for slot, blocks in hits.items()
                    if (position := where(slot)) is not None
                }
            else:
                self._matches = {}
        return self._matches

    @property
    def match_groups(self) -> list[tuple[int, int]] | None:
        """:attr:`matches` by depth — (leading blocks, mask of the positions holding
        exactly that many), shallowest first — when the slots are the positions
        (``ModelIndex.dense_slots``), else None. A prompt hundreds of GPUs hold part of
        (a large zone's system prompt) costs a few big-integer operations, not a dict
        entry per GPU."""
        if not self._grouped:
            groups: list[tuple[int, int]] | None = None
            if self.index.dense_slots:
                groups = []
                hashes = self.request.prefix_hashes
                if hashes:
                    # Slots past the candidates' are retired GPUs' (not candidates).
                    candidates = (1 << len(self.index.ids)) - 1
                    for depth, mask in self.view.accounting.prefix.match_groups(hashes):
                        mask &= candidates
                        if mask:
                            groups.append((depth, mask))
            self._groups = groups
            self._grouped = True
        return self._groups

    def blocks_at(self, position: int) -> int:
        """``matches.get(position, 0)`` without building the dict."""
        if self._matches is None:
            groups = self._groups if self._grouped else self.match_groups
            if groups is not None:
                bit = 1 << position
                for depth, mask in groups:
                    if mask & bit:
                        return depth
                return 0
        return self.matches.get(position, 0)

    @property
    def any_match(self) -> bool:
        """Whether any candidate holds a leading block of the prompt."""
        groups = self._groups if self._grouped else self.match_groups
        return bool(groups) if groups is not None else bool(self.matches)

    @property
    def matched(self) -> Floats:
        """Leading prefix blocks of the request each candidate recently got from us."""
        if self._matched is None:
            matches = self.matches
            if not matches:
                self._matched = self.index.zeros  # shared, read-only
            else:
                count = len(matches)
                self._matched = np.zeros(len(self.index.ids))
                self._matched[np.fromiter(matches, np.intp, count)] = np.fromiter(
                    matches.values(), np.float64, count
                )
        return self._matched

    def uncached_tokens(self, blocks: int) -> float:
        """Prompt tokens left to prefill at a GPU holding the first ``blocks`` blocks
        (the scalar form of :attr:`uncached`, the same float operations)."""
        request = self.request
        return max(0.0, request.input_tokens - blocks * request.tokens_per_block)

    @property
    def uncached(self) -> Floats:
        """This request's prompt tokens each candidate still has to prefill."""
        if self._uncached is None:
            request = self.request
            if self.matches:
                saved = self.matched * request.tokens_per_block
                self._uncached = np.maximum(0.0, request.input_tokens - saved)
            else:
                self._uncached = self.index.zeros + float(request.input_tokens)
        return self._uncached

    def uncached_at(self, position: int) -> float:
        """``uncached[position]`` without building the array."""
        blocks = self.blocks_at(position)
        if not blocks:
            return float(self.request.input_tokens)
        return self.uncached_tokens(blocks)

    def prefill_at(self, position: int) -> tuple[float, int]:
        """``(uncached_at(position), blocks_at(position))`` in one call: what the agent
        charges the chosen GPU."""
        groups = self._groups
        if groups is not None and not groups:  # worked out: no candidate holds a block
            return float(self.request.input_tokens), 0
        blocks = self.blocks_at(position)
        if not blocks:
            return float(self.request.input_tokens), 0
        return self.uncached_tokens(blocks), blocks

    @property
    def queued(self) -> Floats:
        """Uncached prompt tokens already waiting at each candidate (ours + others')."""
        if self._queued is None:
            self._queued = self.pending + self.index.external_queued
        return self._queued

    @property
    def rate_sum(self) -> float:
        """Sum of the survivors' prefill rates (tokens/s)."""
        if self._rate_sum is None:
            index = self.index
            if self.all_alive:
                self._rate_sum = index.rate_sum
            else:
                self._rate_sum = float(np.dot(index.rate, self.alive))
        return self._rate_sum

    def streams_sum(self) -> float:
        """Our sequences in flight over the survivors. (Counts of sequences are whole
        numbers, so every order of summation gives this same float.)"""
        hint = self._streams_hint
        if hint is not None:
            acc = self.view.accounting
            if hint.outside is not None and acc.slot_count == hint.slot_count:
                # The running total minus the few slots that are not survivors.
                total, at = acc.streams_total, acc.streams.item
                for slot in hint.outside:
                    total -= at(slot)
                return total
            # One gather from the accounting instead of two (all slots, then survivors).
            return float(np.add.reduce(acc.streams[hint.slots]))
        streams = self.streams
        if self.all_alive:
            return float(np.add.reduce(streams))
        return float(np.add.reduce(streams[self.survivors]))

    @property
    def kv_free(self) -> Floats:
        """Free KV blocks: the last fresh scrape minus what we sent since, else capacity
        minus our own charge. (Never below ``kv_free_base − kv_own``: our charge is a
        sum of whole blocks, never negative, so what we sent since is at most all of it
        — the free-KV rule's cheap test.)"""
        if self._kv_free is None:
            index = self.index
            self._kv_free = free_blocks(self.kv_own, index.kv_own_base, index.kv_free_base)
        return self._kv_free

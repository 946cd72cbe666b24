"""Where a prompt's prefix was just sent: a tier's dispatch-side placement memory.

A tier that routes by prefix learns where prefixes live from summaries (the zone
sketches, the region summaries) that are published about once a second. Between two of
them, the same long prompt sent again right after its answer — the second turn of every
chat — would be priced as if nothing held it, and could land anywhere. So, as SGLang's
router inserts a request's prefix into its approximate radix tree when it *sends* it
(and llm-d's precise prefix scorer consumes the workers' KV events), the tier that
dispatches remembers where it sent each prompt's blocks, at once.

:class:`PlacementMemory` is that memory: prefix-chained block hash → the target (GPU,
zone or region id) it was last sent to, and when. It is owned by the tier's *edge* (the
code that dispatches: the front door's relay, the regional LB's proxy, the simulator's
tiers), updated there with :meth:`~PlacementMemory.remember` when a request is
dispatched (and again when it finishes: the worker's cache then holds it, freshly
used). A decision never reads the memory itself: the edge asks
:meth:`~PlacementMemory.recall` first and hands the decision the answer, an immutable
:class:`Recall`, with the decision's own immutable view (sans-io, ARCHITECTURE §3).

Invariants:

* **Bounded.** At most ``capacity`` blocks are held (least recently sent evicted first),
  and an entry older than ``ttl_s`` is never recalled (and is dropped when met): the
  memory stays the same size however long the process runs. A prompt's blocks are
  inserted deepest first, so its shallow blocks are the most recent and a prefix is
  always evicted from its deep end: walking a prompt's blocks from the first, a miss
  means no deeper block of that prompt is held either.
* **Latest wins.** A block maps to one target, the last it was sent to: affinity follows
  a conversation that had to move (its target was full), instead of pulling it back.
* **Clock injected.** Every call takes ``now`` (seconds, any monotonic clock: the
  simulator's time, or the process's monotonic clock), so the simulator and the live
  tiers run the same code.

What is *done* with a recall — keep the request where its prefix is, unless that place
is saturated or its cache credit does not pay for its queue — is each tier's rule, next
to its plugins (``global_lb.plugins.affinity.sticky_region``,
``regional_lb.plugins.prefix.sticky_zone``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

#: Leading prompt blocks the tiers above the zone fingerprint for their memories: 16 KiB
#: of text (~4k tokens at the live tiers' 256-byte blocks), enough to tell apart the
#: conversations that share a system prompt, at a few dozen hashes per request.
FINGERPRINT_BLOCKS = 64
#: Blocks remembered per tier. At 48 bytes an entry in the compiled form (a node and two
#: table slots) that is ~3 MB, allocated whole; at the simulator's 512-token blocks it
#: covers ~33 M prompt tokens, at the live tiers' 256-byte text blocks ~16 MB of text.
DEFAULT_CAPACITY = 65_536
#: How long a placement is trusted without being sent again. vLLM keeps a finished
#: request's blocks until their memory is needed: minutes on a busy GPU. A chat's next
#: turn comes seconds to minutes after the answer.
DEFAULT_TTL_S = 300.0


@dataclass(frozen=True, slots=True)
class Recall:
    """Where the longest remembered prefix of a prompt was last sent."""

    #: The GPU, zone or region id.
    target: str
    #: Leading blocks of the prompt it was sent with (≥ 1).
    blocks: int
    #: When (the ``now`` of the last :meth:`PlacementMemory.remember` that sent them).
    at: float
    #: Prompt tokens of the request that was sent then (0: not given).
    tokens: int = 0

    def share(self, total_blocks: int) -> float:
        """The share of a prompt of ``total_blocks`` blocks that the recall covers."""
        return min(1.0, self.blocks / total_blocks) if total_blocks > 0 else 0.0

    def held_tokens(
        self,
        prompt_tokens: int,
        fingerprint_blocks: int,
        tokens_per_block: float,
        blocks: int | None = None,
    ) -> float:
        """Prompt tokens of a request the target holds: its ``blocks`` (default: the
        recalled) leading blocks of ``tokens_per_block`` tokens — or, when the recall
        matched every one of the ``fingerprint_blocks`` the request is fingerprinted
        by, up to the whole prompt sent then (:attr:`tokens`); never more than
        ``prompt_tokens``.

        The tiers fingerprint a prompt's leading blocks only (at most
        :data:`FINGERPRINT_BLOCKS`: a few thousand tokens of text), so a match of all
        of them says nothing of where the two prompts part, and a conversation's next
        turn repeats its previous prompt whole. Counting the fingerprint alone priced a
        long conversation's home as if it held its first few thousand tokens, and the
        next turn left for a shorter queue to prefill the rest again."""
        held = (self.blocks if blocks is None else blocks) * max(0.0, tokens_per_block)
        if self.tokens and self.blocks >= fingerprint_blocks > 0:
            held = max(held, float(self.tokens))
        return min(float(prompt_tokens), held)


def _check(capacity: int, ttl_s: float) -> None:
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity!r}")
    if not (ttl_s > 0.0 and math.isfinite(ttl_s)):
        raise ValueError(f"ttl_s must be a finite number > 0, got {ttl_s!r}")


class DictPlacementMemory:
    """Block hash → (target, time), an LRU bounded by ``capacity`` and ``ttl_s``.

    The reference form, in an OrderedDict: what the compiled form (``_placement.c``)
    must give, and what runs where it is not built. It allocates as it fills, and its
    size follows the recent request rate (see :data:`PlacementMemory`).

    Not thread-safe: a tier calls it from its event loop, between decisions.
    """

    __slots__ = ("_capacity", "_entries", "_ttl")

    def __init__(self, capacity: int = DEFAULT_CAPACITY, ttl_s: float = DEFAULT_TTL_S) -> None:
        _check(capacity, ttl_s)
        self._capacity = capacity
        self._ttl = ttl_s
        #: Oldest first. Entries are stamped with non-decreasing ``now`` (the callers'
        #: clocks are monotonic), so the LRU order is also the time order.
        self._entries: OrderedDict[int, tuple[str, float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def ttl_s(self) -> float:
        return self._ttl

    def remember(self, hashes: Sequence[int], target: str, now: float, tokens: int = 0) -> None:
        """``hashes`` (the prefix-chained block hashes of a prompt of ``tokens`` tokens)
        were sent to ``target``."""
        if not hashes:
            return
        entries = self._entries
        value = (target, now, tokens)
        move = entries.move_to_end
        # Deepest first: the shallow blocks end up the most recent (see the module).
        for block in reversed(hashes):
            if block in entries:
                move(block)
            entries[block] = value
        self._trim(now)

    def recall(self, hashes: Sequence[int], now: float) -> Recall | None:
        """The target of the deepest of ``hashes``' leading blocks still remembered and
        fresh (``None``: not even the first is)."""
        entries = self._entries
        horizon = now - self._ttl
        found: tuple[str, float, int] | None = None
        depth = 0
        get = entries.get
        for block in hashes:
            entry = get(block)
            if entry is None or entry[1] <= horizon:
                break
            found = entry
            depth += 1
        if found is None:
            return None
        return Recall(found[0], depth, found[1], found[2])

    def forget(self, target: str) -> None:
        """``target`` lost its cache (it left, restarted, or was drained away): no
        prompt is recalled there any more. O(entries): for membership changes, not
        for the request path."""
        entries = self._entries
        for block in [b for b, (t, _, _) in entries.items() if t == target]:
            del entries[block]

    def expire(self, now: float) -> None:
        """Drop the entries past their time (cheap: they are at the old end)."""
        self._trim(now)

    def _trim(self, now: float) -> None:
        entries = self._entries
        while len(entries) > self._capacity:
            entries.popitem(last=False)
        horizon = now - self._ttl
        while entries:
            block, (_, at, _) = next(iter(entries.items()))
            if at > horizon:
                break
            del entries[block]


if TYPE_CHECKING:
    PlacementMemory = DictPlacementMemory
else:
    try:  # the compiled form (setup.py builds it when it can)
        from gtm.routing._placement import PlacementCore
    except ImportError:  # pragma: no cover - an install without a C compiler
        PlacementMemory = DictPlacementMemory
    else:

        class PlacementMemory(PlacementCore):
            __doc__ = DictPlacementMemory.__doc__
            __slots__ = ()

            def __init__(
                self, capacity: int = DEFAULT_CAPACITY, ttl_s: float = DEFAULT_TTL_S
            ) -> None:
                _check(capacity, ttl_s)
                super().__init__(capacity, ttl_s)

            def recall(self, hashes: Sequence[int], now: float) -> Recall | None:
                found = self.recall_raw(hashes, now)
                return None if found is None else Recall(*found)


#: The memory the tiers and the simulator run: the compiled form when built (its
#: ``capacity`` entries allocated and written when it is made, so a tier's memory does
#: not follow the request rate up — the dict form grew with every busier hour and never
#: gave it back, the soak's global and regional growth of issue 25), else
#: :class:`DictPlacementMemory`. Which one runs is in ``gtm --version`` (:mod:`gtm.native`).
COMPILED = PlacementMemory is not DictPlacementMemory

__all__ = [
    "COMPILED",
    "DEFAULT_CAPACITY",
    "DEFAULT_TTL_S",
    "FINGERPRINT_BLOCKS",
    "DictPlacementMemory",
    "PlacementMemory",
    "Recall",
]

"""Prompt fingerprints and the agent's index of prefix blocks it recently sent to each GPU.

Fingerprints
    The agent cannot see a worker's KV cache, so, like SGLang's cache-aware router and
    llm-d's approximate prefix scorer, it remembers what it *sent* where, keyed by the
    prompt fingerprints of :mod:`gtm.fingerprint` (prefix-chained hashes of 256-byte text
    blocks, shared with the regional LB). A block covers ``input_tokens · 256 / bytes``
    tokens of that prompt.

Index
    :class:`PrefixIndex` maps a block hash to a bit mask of the GPU slots that got it
    recently, with one LRU per slot bounded by what that GPU's KV cache can hold (an
    approximation of its eviction, which is LRU in vLLM). Matching a prompt walks its
    blocks once, AND-ing masks, so it costs O(matched blocks), not O(GPUs). It is the
    zone's dispatch-side placement memory: the accounting inserts a prompt's blocks
    when it sends the request (:meth:`zone_agent.accounting.Accounting.start`), so the
    next request sees them at once, before any scrape.

What the agent does with it beyond the profile's cache credit: :mod:`zone_agent.affinity`.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from collections.abc import Iterable
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from gtm.fingerprint import MAX_TEXT_BLOCKS, TEXT_BLOCK_BYTES, text_block_hashes

#: Bytes of prompt text per prefix block (the fingerprint every tier shares).
BLOCK_BYTES = TEXT_BLOCK_BYTES

#: Characters hashed by the consistent-hash baseline: the seeds' example keys requests by
#: the MD5 of the first 256 characters of the prompt.
HASH_KEY_CHARS = 256

#: Longest prompt fingerprinted, in blocks.
MAX_BLOCKS = MAX_TEXT_BLOCKS

__all__ = [
    "BLOCK_BYTES",
    "COMPILED",
    "MAX_BLOCKS",
    "DictPrefixIndex",
    "PrefixIndex",
    "consistent_hash_key",
    "iter_bits",
    "mask_bytes",
    "set_bits",
    "text_block_hashes",
]


def consistent_hash_key(text: str) -> int:
    """The seeds' request key: MD5 of the first 256 characters, as a 128-bit integer.

    Made from a copy of one empty MD5 state: OpenSSL 3 (hashlib's MD5) looks the
    algorithm up in its provider on every constructor call, a copy does not."""
    digest = _MD5.copy()
    digest.update(text[:HASH_KEY_CHARS].encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest(), "big")


_MD5 = hashlib.md5(usedforsecurity=False)


def iter_bits(mask: int) -> Iterable[int]:
    """Indices of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


#: From this many set bits on, :func:`set_bits` reads them from the mask's bytes (a fixed
#: cost, then cheap per bit) rather than one bit at a time (three big-integer operations
#: per bit, dearer on wide masks). Measured crossover: about 32 bits.
BYTES_FROM = 32


def mask_bytes(mask: int) -> bytes:
    """A non-negative bit mask as little-endian bytes (bit i of the mask: bit i % 8 of
    byte i // 8), as :func:`set_bits` and the zone's cost kernel read it."""
    return mask.to_bytes((mask.bit_length() + 7) // 8, "little")


def set_bits(mask: int) -> list[int]:
    """``list(iter_bits(mask))`` for a non-negative ``mask`` (from its bytes, with
    numpy, when it has :data:`BYTES_FROM` set bits or more)."""
    if mask.bit_count() < BYTES_FROM:
        return list(iter_bits(mask))
    bits = np.unpackbits(np.frombuffer(mask_bytes(mask), dtype=np.uint8), bitorder="little")
    found: list[int] = np.flatnonzero(bits).tolist()
    return found


class DictPrefixIndex:
    """Block hash → GPU slots that recently received it; per-slot LRU with a capacity.

    The reference form, in dicts: what the compiled form (``_prefix.c``) must give, and
    what runs where it is not built. It allocates as it fills, so a process running it
    grows until every slot's LRU is full (see :data:`PrefixIndex`).

    Mutated only by the agent's accounting, between decisions (decisions are synchronous,
    so none ever sees a half-applied insert).
    """

    def __init__(self) -> None:
        self._slots_of: dict[int, int] = {}
        self._lru: dict[int, OrderedDict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._slots_of)

    def blocks(self, slot: int) -> int:
        """How many blocks ``slot`` holds (SGLang's "tree size" of a worker)."""
        lru = self._lru.get(slot)
        return 0 if lru is None else len(lru)

    def insert(self, slot: int, hashes: Iterable[int], capacity: int) -> None:
        """Record that ``slot`` got these blocks; evict its least recent beyond ``capacity``."""
        lru = self._lru.get(slot)
        if lru is None:
            lru = self._lru[slot] = OrderedDict()
        bit = 1 << slot
        slots_of = self._slots_of
        get = slots_of.get
        for block in hashes:
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                slots_of[block] = get(block, 0) | bit
        limit = max(0, capacity)
        while len(lru) > limit:
            old, _ = lru.popitem(last=False)
            self._clear(old, bit)

    def forget(self, slot: int) -> None:
        """Drop everything ``slot`` holds (the GPU left or restarted: its cache is gone)."""
        lru = self._lru.pop(slot, None)
        if lru is None:
            return
        bit = 1 << slot
        for block in lru:
            self._clear(block, bit)

    def _clear(self, block: int, bit: int) -> None:
        mask = self._slots_of.get(block, 0) & ~bit
        if mask:
            self._slots_of[block] = mask
        else:
            self._slots_of.pop(block, None)

    def match(self, hashes: tuple[int, ...]) -> dict[int, int]:
        """Slot → leading blocks of ``hashes`` it holds, for every slot holding at least
        one (shallowest first, then lowest slot first): a new dict, the caller's."""
        return _match(self, hashes)

    def match_groups(self, hashes: tuple[int, ...]) -> list[tuple[int, int]]:
        """:meth:`match` by depth: (leading blocks, mask of the slots holding exactly
        that many), shallowest first, for each depth some slot stops at. Walking the
        blocks once, AND-ing masks: O(matched blocks), however many slots hold them."""
        groups: list[tuple[int, int]] = []
        if not hashes:
            return groups
        get = self._slots_of.get
        alive = get(hashes[0], 0)
        depth = 1
        end = len(hashes)
        while alive:
            still = alive & get(hashes[depth], 0) if depth < end else 0
            gone = alive & ~still
            if gone:
                groups.append((depth, gone))
            alive = still
            depth += 1
        return groups

    def holders(self, block: int) -> int:
        """Bit mask of the slots holding ``block``."""
        return self._slots_of.get(block, 0)


def _match(index: DictPrefixIndex, hashes: tuple[int, ...]) -> dict[int, int]:
    matched: dict[int, int] = {}
    for depth, gone in index.match_groups(hashes):
        matched.update(dict.fromkeys(set_bits(gone), depth))
    return matched


if TYPE_CHECKING:
    PrefixIndex = DictPrefixIndex
else:
    try:  # the compiled form (setup.py builds it when it can)
        from zone_agent._prefix import PrefixIndex as _CompiledIndex
    except ImportError:  # pragma: no cover - an install without a C compiler
        PrefixIndex = DictPrefixIndex
    else:

        class PrefixIndex(_CompiledIndex):
            __doc__ = _CompiledIndex.__doc__
            __slots__ = ()
            match = _match


#: The index the agent runs: the compiled form when built (every structure allocated
#: when a GPU's slot first gets blocks, sized by its capacity, so memory does not grow
#: with traffic — a dict form grew for as long as a busy zone took to fill its GPUs'
#: LRUs, hours in the soak of issue 25), else :class:`DictPrefixIndex`. Which one runs
#: is in ``gtm --version`` and the zone agent's start-up warning
#: (:mod:`gtm.native`).
COMPILED = PrefixIndex is not DictPrefixIndex


class HotBlocks:
    """Approximate top-k of prefix blocks by how often requests start with them.

    Space-Saving (Metwally, Agrawal, El Abbadi, "Efficient computation of frequent and
    top-k elements in data streams", ICDT 2005): ``capacity`` counters; a new block
    replaces the smallest counter and inherits its count + 1, so every block with a true
    frequency above ``N / capacity`` is kept. The zone summary publishes the top few as
    its ``prefix_sketch``, so the regional tier can see where hot prefixes live.
    """

    def __init__(self, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._counts: dict[int, int] = {}
        #: When each block got its counter (the counters' insertion order).
        self._since: dict[int, int] = {}
        self._clock = 0
        #: (count, since, block) for every counter, smallest first; entries whose count
        #: or since no longer match are stale and skipped (a lazy-deletion heap: the
        #: victim costs O(log capacity), not a scan of every counter).
        self._heap: list[tuple[int, int, int]] = []

    def add(self, block: int) -> None:
        counts = self._counts
        found = counts.get(block)
        if found is not None:
            counts[block] = found + 1
            heapq.heappush(self._heap, (found + 1, self._since[block], block))
            if len(self._heap) > 4 * self._capacity + 64:
                self._compact()
            return
        count = 1
        if len(counts) >= self._capacity:
            # The smallest counter; among equals the oldest (what a scan of the counters
            # in insertion order picks first).
            heap, since = self._heap, self._since
            while True:
                low, at, victim = heap[0]
                if counts.get(victim) == low and since[victim] == at:
                    break
                heapq.heappop(heap)
            heapq.heappop(heap)
            count = counts.pop(victim) + 1
            del since[victim]
        self._clock += 1
        counts[block] = count
        self._since[block] = self._clock
        heapq.heappush(self._heap, (count, self._clock, block))

    def _compact(self) -> None:
        since = self._since
        self._heap = [(count, since[block], block) for block, count in self._counts.items()]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        """Counters in use (at most ``capacity``)."""
        return len(self._counts)

    def top(self, k: int) -> tuple[int, ...]:
        """The ``k`` most frequent blocks, most frequent first (ties: smaller hash)."""
        # Two stable C sorts instead of one with a Python key (every zone summary, every
        # second, sorts all the counters): by hash, then by count, highest first.
        ranked = sorted(self._counts.items())
        ranked.sort(key=itemgetter(1), reverse=True)
        return tuple(block for block, _ in ranked[:k])

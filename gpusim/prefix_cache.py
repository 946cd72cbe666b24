"""The KV-cache block pool with automatic prefix caching, as vLLM V1 keeps it.

A worker's KV cache is ``num_blocks`` blocks of ``block_size`` tokens. A block that
holds a *full* block of prompt tokens is registered under that block's prefix-chained
hash (:func:`gtm.tokens.block_hashes`), so a later request with the same prefix can
reuse it instead of recomputing it. When a request finishes, its blocks are released:
registered ones stay cached but become *evictable* (least recently released first),
unregistered ones go straight back to the free list. Allocation takes free blocks
first and then evicts the least recently used cached block, dropping its hash.

Counters follow vLLM's ``vllm:prefix_cache_queries_total`` / ``..._hits_total``: both
are in *tokens* (prompt tokens looked up, and tokens found cached).

Sans-io and synchronous; the engine owns one pool. Every structure is allocated whole
when the pool is made, sized by ``num_blocks``, and never grows: the hash index is an
open-addressing table in two arrays (hash → block, linear probing, at most half full,
deletion by backward shift — Knuth, TAOCP vol. 3, 6.4, algorithm R), the LRU of
evictable blocks a doubly linked list threaded through two arrays, and each block's
hash an array slot. So a worker's memory is the same with an empty cache as with a
full one (a dict entry per cached block grew it for as long as the cache took to
fill under a soak), and the garbage collector has nothing to traverse: a pool can
have millions of blocks.

Hashes are 64-bit (``gtm.tokens.block_hashes``); any other int is taken modulo 2**64.

A :class:`PoolListener` (``listener``) hears every hash registered and dropped, as vLLM's
block pool queues its KV-cache events (``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``): :mod:`gpusim.kv_events` publishes them.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Protocol

_MASK64 = (1 << 64) - 1
#: A free slot of the hash table / no neighbour in the LRU list / no hash on a block.
_NONE = -1


class PoolListener(Protocol):
    """Hears the pool's cache changes (vLLM's KV-cache events), in the order they happen."""

    def stored(self, block_hash: int) -> None:
        """A block was registered under ``block_hash``."""

    def removed(self, block_hash: int) -> None:
        """The block registered under ``block_hash`` was evicted."""

    def cleared(self) -> None:
        """Every cached block was dropped."""


class BlockPool:
    """Fixed set of KV blocks with reference counts, a hash index and an LRU."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # A stack of never-hashed free blocks; popped from the end, so block 0 goes first.
        self._free = array("q", range(num_blocks - 1, -1, -1))
        self._ref = array("q", bytes(8 * num_blocks))  # reference counts, all 0
        # Evictable blocks (cached, unreferenced), least recently released first: a
        # doubly linked list through _prev/_next, _NONE at the ends.
        self._prev = array("q", [_NONE]) * num_blocks
        self._next = array("q", [_NONE]) * num_blocks
        self._head = self._tail = _NONE
        self._evictable_count = 0
        self._in_lru = bytearray(num_blocks)
        # Block -> its hash, for registered blocks (_has_hash[block] == 1).
        self._hash_of = array("Q", bytes(8 * num_blocks))
        self._has_hash = bytearray(num_blocks)
        # Hash -> block: open addressing over a power-of-two table at most half full
        # (at most num_blocks hashes are registered at once: one per block).
        size = 1 << (2 * num_blocks - 1).bit_length()
        self._slot_mask = size - 1
        self._keys = array("Q", bytes(8 * size))
        self._blocks = array("q", [_NONE]) * size
        self._cached = 0
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0
        #: Told of every registration and eviction (KV events); none by default.
        self.listener: PoolListener | None = None

    # ------------------------------------------------------------------ queries

    @property
    def num_free(self) -> int:
        """Blocks that an allocation may take (free + cached-but-unreferenced)."""
        return len(self._free) + self._evictable_count

    @property
    def num_cached(self) -> int:
        """Blocks registered under a prefix hash (in use or evictable)."""
        return self._cached

    def usage(self) -> float:
        """Fraction of blocks held by running requests, in [0, 1] (vLLM's KV usage)."""
        return 1.0 - self.num_free / self.num_blocks

    def is_cached(self, block_hash: int) -> bool:
        return self._find(block_hash & _MASK64) != _NONE

    def cached_hashes(self) -> frozenset[int]:
        blocks, keys = self._blocks, self._keys
        return frozenset(keys[i] for i in range(len(blocks)) if blocks[i] != _NONE)

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``hashes`` (at most ``max_blocks``)."""
        if not self.enable_caching:
            return []
        found: list[int] = []
        find = self._find
        for block_hash in hashes[:max_blocks]:
            block = find(block_hash & _MASK64)
            if block == _NONE:
                break
            found.append(block)
        return found

    def evictable_among(self, blocks: Iterable[int]) -> int:
        """How many of ``blocks`` are unreferenced (touching them uses up free capacity)."""
        return sum(1 for b in blocks if self._ref[b] == 0)

    def record_query(self, queried_tokens: int, hit_tokens: int) -> None:
        self.query_tokens += queried_tokens
        self.hit_tokens += hit_tokens

    # ------------------------------------------------------------------ changes

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference on cached blocks (they stop being evictable)."""
        for block in blocks:
            if self._ref[block] == 0 and self._in_lru[block]:
                self._unlink(block)
            self._ref[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks (evicting LRU cached ones if needed), or ``None``."""
        if count > self.num_free:
            return None
        out: list[int] = []
        for _ in range(count):
            if self._free:
                block = self._free.pop()
            else:
                block = self._head
                self._unlink(block)
                self._drop_hash(block)
                self.evictions += 1
            self._ref[block] = 1
            out.append(block)
        return out

    def register(self, block: int, block_hash: int) -> None:
        """Publish a full block under its prefix hash (first writer wins, like vLLM)."""
        if not self.enable_caching or self._has_hash[block]:
            return
        key = block_hash & _MASK64
        mask, keys, blocks = self._slot_mask, self._keys, self._blocks
        slot = key & mask
        while blocks[slot] != _NONE:
            if keys[slot] == key:
                return  # an identical block is cached already; this copy stays private
            slot = (slot + 1) & mask
        keys[slot] = key
        blocks[slot] = block
        self._hash_of[block] = key
        self._has_hash[block] = 1
        self._cached += 1
        if self.listener is not None:
            self.listener.stored(key)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a request's references. Tail blocks first, so they are evicted first."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] > 0:
                continue
            if self._has_hash[block]:
                self._append(block)
            else:
                self._free.append(block)

    def reset(self) -> None:
        """Forget everything cached (model reload). Referenced blocks must be released."""
        block = self._head
        while block != _NONE:
            following = self._next[block]
            self._unlink(block)
            self._drop_hash(block, notify=False)
            self._free.append(block)
            block = following
        if self.listener is not None:
            self.listener.cleared()

    # ------------------------------------------------------------------ internals

    def _find(self, key: int) -> int:
        """The block registered under ``key`` (reduced to 64 bits), or ``_NONE``."""
        mask, keys, blocks = self._slot_mask, self._keys, self._blocks
        slot = key & mask
        while True:
            block = blocks[slot]
            if block == _NONE or keys[slot] == key:
                return block
            slot = (slot + 1) & mask

    def _append(self, block: int) -> None:
        """Make ``block`` the most recently released evictable one."""
        tail = self._tail
        self._prev[block] = tail
        self._next[block] = _NONE
        if tail == _NONE:
            self._head = block
        else:
            self._next[tail] = block
        self._tail = block
        self._in_lru[block] = 1
        self._evictable_count += 1

    def _unlink(self, block: int) -> None:
        prev, nxt = self._prev[block], self._next[block]
        if prev == _NONE:
            self._head = nxt
        else:
            self._next[prev] = nxt
        if nxt == _NONE:
            self._tail = prev
        else:
            self._prev[nxt] = prev
        self._in_lru[block] = 0
        self._evictable_count -= 1

    def _drop_hash(self, block: int, *, notify: bool = True) -> None:
        if not self._has_hash[block]:
            return
        self._has_hash[block] = 0
        key = self._hash_of[block]
        mask, keys, blocks = self._slot_mask, self._keys, self._blocks
        slot = key & mask
        while blocks[slot] != block:
            if blocks[slot] == _NONE:
                return  # registered as a private copy: the hash names another block
            slot = (slot + 1) & mask
        self._cached -= 1
        # Backward-shift deletion: move up any later entry of the probe run whose home
        # slot is not cyclically in (hole, its slot], so every lookup still finds it.
        hole = slot
        slot = (slot + 1) & mask
        while blocks[slot] != _NONE:
            home = keys[slot] & mask
            if (slot - home) & mask >= (slot - hole) & mask:
                keys[hole] = keys[slot]
                blocks[hole] = blocks[slot]
                hole = slot
            slot = (slot + 1) & mask
        blocks[hole] = _NONE
        if notify and self.listener is not None:
            self.listener.removed(key)

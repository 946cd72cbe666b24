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

Sans-io and synchronous; the engine owns one pool. Per-block state lives in arrays
and int-only dicts, which the garbage collector does not traverse: a pool can have
millions of blocks, and objects or lists of that many would make every full collection
walk them all, stalling the event loop.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence


class BlockPool:
    """Fixed set of KV blocks with reference counts, a hash index and an LRU."""

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        # A stack of never-hashed free blocks; popped from the end, so block 0 goes first.
        self._free = array("q", range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._ref = array("q", bytes(8 * num_blocks))  # reference counts, all 0
        self._hash_of: dict[int, int] = {}  # block -> hash, for registered blocks
        self._by_hash: dict[int, int] = {}
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    # ------------------------------------------------------------------ queries

    @property
    def num_free(self) -> int:
        """Blocks that an allocation may take (free + cached-but-unreferenced)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Blocks registered under a prefix hash (in use or evictable)."""
        return len(self._by_hash)

    def usage(self) -> float:
        """Fraction of blocks held by running requests, in [0, 1] (vLLM's KV usage)."""
        return 1.0 - self.num_free / self.num_blocks

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._by_hash

    def cached_hashes(self) -> frozenset[int]:
        return frozenset(self._by_hash)

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``hashes`` (at most ``max_blocks``)."""
        if not self.enable_caching:
            return []
        found: list[int] = []
        for block_hash in hashes[:max_blocks]:
            block = self._by_hash.get(block_hash)
            if block is None:
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
            if self._ref[block] == 0:
                self._evictable.pop(block, None)
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
                block, _ = self._evictable.popitem(last=False)
                self._drop_hash(block)
                self.evictions += 1
            self._ref[block] = 1
            out.append(block)
        return out

    def register(self, block: int, block_hash: int) -> None:
        """Publish a full block under its prefix hash (first writer wins, like vLLM)."""
        if not self.enable_caching or block in self._hash_of:
            return
        if block_hash in self._by_hash:
            return  # an identical block is cached already; this copy stays private
        self._hash_of[block] = block_hash
        self._by_hash[block_hash] = block

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a request's references. Tail blocks first, so they are evicted first."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] > 0:
                continue
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def reset(self) -> None:
        """Forget everything cached (model reload). Referenced blocks must be released."""
        for block in list(self._evictable):
            self._drop_hash(block)
            self._free.append(block)
        self._evictable.clear()

    def _drop_hash(self, block: int) -> None:
        block_hash = self._hash_of.pop(block, None)
        if block_hash is not None and self._by_hash.get(block_hash) == block:
            del self._by_hash[block_hash]

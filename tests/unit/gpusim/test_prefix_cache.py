from __future__ import annotations

import random
import tracemalloc
from collections import OrderedDict

import pytest

from gpusim.prefix_cache import BlockPool


def test_allocate_release_and_usage() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert blocks == [0, 1, 2]
    assert pool.num_free == 1
    assert pool.usage() == pytest.approx(0.75)
    assert pool.allocate(2) is None  # never a partial allocation
    pool.release(blocks)
    assert pool.num_free == 4
    assert pool.usage() == 0.0


def test_registered_blocks_stay_cached_after_release_and_are_found_again() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.register(blocks[0], 111)
    pool.register(blocks[1], 222)
    pool.release(blocks)
    assert pool.num_free == 4  # evictable blocks count as free (vLLM's usage)
    assert pool.num_cached == 2
    assert pool.lookup([111, 222, 333], max_blocks=3) == blocks
    assert pool.lookup([111, 222], max_blocks=1) == blocks[:1]
    assert pool.lookup([999, 222], max_blocks=2) == []  # prefix-chained: stop at first miss


def test_touch_takes_cached_blocks_out_of_the_lru() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.register(blocks[0], 1)
    pool.release(blocks)
    assert pool.evictable_among(blocks) == 2
    pool.touch([blocks[0]])
    assert pool.evictable_among(blocks) == 1
    assert pool.num_free == 1
    fresh = pool.allocate(1)
    assert fresh == [blocks[1]]  # the referenced cached block is not taken
    assert pool.is_cached(1)


def test_eviction_is_least_recently_released_first_and_tail_blocks_go_first() -> None:
    pool = BlockPool(4)
    first = pool.allocate(2)
    second = pool.allocate(2)
    assert first is not None
    assert second is not None
    for block, block_hash in zip([*first, *second], [10, 11, 20, 21], strict=True):
        pool.register(block, block_hash)
    pool.release(first)  # released first: evicted first, its tail block (11) before 10
    pool.release(second)
    taken = pool.allocate(1)
    assert taken == [first[1]]
    assert not pool.is_cached(11)
    assert pool.is_cached(10)
    pool.allocate(1)
    assert not pool.is_cached(10)
    assert pool.cached_hashes() == frozenset({20, 21})
    assert pool.evictions == 2


def test_first_writer_wins_for_duplicate_hashes() -> None:
    pool = BlockPool(3)
    a = pool.allocate(1)
    b = pool.allocate(1)
    assert a is not None
    assert b is not None
    pool.register(a[0], 5)
    pool.register(b[0], 5)  # same content computed twice: the copy stays private
    pool.release(b)
    assert pool.num_cached == 1
    assert pool.lookup([5], 1) == a
    pool.register(a[0], 6)  # a block keeps its first hash
    assert pool.lookup([6], 1) == []


def test_query_counters_and_disabled_caching() -> None:
    pool = BlockPool(2, enable_caching=False)
    blocks = pool.allocate(1)
    assert blocks is not None
    pool.register(blocks[0], 1)
    assert pool.lookup([1], 1) == []
    pool.record_query(100, 32)
    pool.record_query(50, 0)
    assert (pool.query_tokens, pool.hit_tokens) == (150, 32)


def test_reset_forgets_evictable_blocks() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.register(blocks[0], 1)
    pool.release(blocks)
    pool.reset()
    assert pool.num_cached == 0
    assert pool.num_free == 2
    assert pool.lookup([1], 1) == []


def test_a_pool_needs_blocks() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)


class _Reference:
    """The pool as it was written with dicts (an OrderedDict LRU), for comparison."""

    def __init__(self, n: int) -> None:
        self.free = list(range(n - 1, -1, -1))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.ref = [0] * n
        self.hash_of: dict[int, int] = {}
        self.by_hash: dict[int, int] = {}
        self.evictions = 0

    def allocate(self, count: int) -> list[int] | None:
        if count > len(self.free) + len(self.evictable):
            return None
        out = []
        for _ in range(count):
            if self.free:
                block = self.free.pop()
            else:
                block, _ = self.evictable.popitem(last=False)
                h = self.hash_of.pop(block, None)
                if h is not None and self.by_hash.get(h) == block:
                    del self.by_hash[h]
                self.evictions += 1
            self.ref[block] = 1
            out.append(block)
        return out

    def register(self, block: int, h: int) -> None:
        if block in self.hash_of or h in self.by_hash:
            return
        self.hash_of[block] = h
        self.by_hash[h] = block

    def touch(self, blocks: list[int]) -> None:
        for block in blocks:
            if self.ref[block] == 0:
                self.evictable.pop(block, None)
            self.ref[block] += 1

    def release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                if block in self.hash_of:
                    self.evictable[block] = None
                else:
                    self.free.append(block)

    def lookup(self, hashes: list[int]) -> list[int]:
        found = []
        for h in hashes:
            if h not in self.by_hash:
                break
            found.append(self.by_hash[h])
        return found


@pytest.mark.parametrize("stride", [1, 1 << 20])  # 1 << 20: every hash in one probe run
def test_the_array_pool_behaves_as_the_dict_pool_did(stride: int) -> None:
    rng = random.Random(7)
    n = 64
    pool, ref = BlockPool(n), _Reference(n)
    held: list[list[int]] = []
    for _ in range(5000):
        # Prompts share prefixes: hashes are drawn from a small space, chained by depth.
        prefix = [((rng.randrange(12) * 31 + d) * stride) for d in range(rng.randrange(1, 9))]
        found = pool.lookup(prefix, max_blocks=len(prefix))
        assert found == ref.lookup(prefix)
        pool.touch(found)
        ref.touch(found)
        more = len(prefix) - len(found)
        got = pool.allocate(more)
        assert got == ref.allocate(more)
        if got is not None:
            for block, h in zip(got, prefix[len(found) :], strict=True):
                pool.register(block, h)
                ref.register(block, h)
            held.append(found + got)
        else:
            pool.release(found)
            ref.release(found)
        while held and (rng.random() < 0.5 or got is None):
            blocks = held.pop(rng.randrange(len(held)))
            pool.release(blocks)
            ref.release(blocks)
            if got is None:
                break
        assert pool.num_free == len(ref.free) + len(ref.evictable)
        assert pool.num_cached == len(ref.by_hash)
        assert pool.cached_hashes() == frozenset(ref.by_hash)
    assert pool.evictions == ref.evictions > 0


def test_a_full_cache_takes_no_more_memory_than_an_empty_one() -> None:
    n = 2048
    tracemalloc.start()
    try:
        pool = BlockPool(n)
        empty = tracemalloc.get_traced_memory()[0]
        for k in range(5):  # five caches' worth of distinct blocks
            blocks = pool.allocate(n)
            assert blocks is not None
            for i, block in enumerate(blocks):
                pool.register(block, (k << 32) | i)
            pool.release(blocks)
            del blocks
        full = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert pool.num_cached == n
    # Nothing is allocated per cached block (a dict entry and its int objects were
    # ~280 bytes a block): what is left is noise of the interpreter's own.
    assert full - empty < 4 * 1024
    assert pool.lookup([(4 << 32) | i for i in range(3)], 3) != []

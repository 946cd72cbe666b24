from __future__ import annotations

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

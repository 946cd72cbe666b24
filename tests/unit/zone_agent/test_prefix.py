from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm import native
from gtm.testing.kernels import expected_state
from zone_agent.prefix import (
    BLOCK_BYTES,
    COMPILED,
    DictPrefixIndex,
    HotBlocks,
    PrefixIndex,
    consistent_hash_key,
    iter_bits,
    text_block_hashes,
)


def test_hashes_cover_full_blocks_only_and_chain() -> None:
    data = b"a" * (BLOCK_BYTES * 3 + 10)
    hashes = text_block_hashes(data)
    assert len(hashes) == 3
    # Equal blocks at different depths hash differently: the parent is part of the hash.
    assert len(set(hashes)) == 3


def test_shared_prefix_shares_exactly_the_common_blocks() -> None:
    common = b"x" * (BLOCK_BYTES * 2)
    a = text_block_hashes(common + b"A" * BLOCK_BYTES)
    b = text_block_hashes(common + b"B" * BLOCK_BYTES)
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_consistent_hash_key_is_md5_of_first_256_chars() -> None:
    text = "é" * 300
    expected = int.from_bytes(hashlib.md5(("é" * 256).encode()).digest(), "big")
    assert consistent_hash_key(text) == expected
    assert consistent_hash_key(text) == consistent_hash_key(text[:256] + "different tail")


@pytest.mark.parametrize(
    ("mask", "bits"), [(0, []), (1, [0]), (0b1010, [1, 3]), (1 << 900 | 4, [2, 900])]
)
def test_iter_bits(mask: int, bits: list[int]) -> None:
    assert list(iter_bits(mask)) == bits


def test_match_counts_leading_blocks_per_slot() -> None:
    index = PrefixIndex()
    index.insert(0, (1, 2, 3), capacity=10)
    index.insert(5, (1, 2), capacity=10)
    index.insert(7, (9,), capacity=10)
    assert index.match((1, 2, 3, 4)) == {0: 3, 5: 2}
    assert index.match((8, 2, 3)) == {}  # the first block is nowhere: nothing matches
    assert index.match(()) == {}
    assert index.blocks(0) == 3


def test_capacity_evicts_least_recent_and_clears_masks() -> None:
    index = PrefixIndex()
    index.insert(1, (10, 11, 12), capacity=3)
    index.insert(1, (10,), capacity=3)  # touch 10: 11 is now the oldest
    index.insert(1, (13,), capacity=3)
    assert index.holders(11) == 0
    assert index.holders(10) == 0b10
    assert index.blocks(1) == 3
    assert len(index) == 3


def test_forget_drops_a_slot_everywhere() -> None:
    index = PrefixIndex()
    index.insert(0, (1, 2), capacity=10)
    index.insert(1, (1, 2), capacity=10)
    index.forget(0)
    assert index.match((1, 2)) == {1: 2}
    index.forget(0)  # idempotent
    index.forget(1)
    assert len(index) == 0


def test_hot_blocks_keeps_the_frequent_ones() -> None:
    hot = HotBlocks(capacity=3)
    for block in [1, 1, 1, 2, 2, 3, 4, 5, 1]:
        hot.add(block)
    assert hot.top(1) == (1,)
    assert 1 in hot.top(3)
    with pytest.raises(ValueError, match="capacity"):
        HotBlocks(0)


class _ScanHotBlocks:
    """The reference Space-Saving: the victim found by scanning every counter in
    insertion order (what HotBlocks did before its heap)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.counts: dict[int, int] = {}

    def add(self, block: int) -> None:
        counts = self.counts
        if block in counts:
            counts[block] += 1
        elif len(counts) < self.capacity:
            counts[block] = 1
        else:
            victim = min(counts, key=counts.__getitem__)
            counts[block] = counts.pop(victim) + 1


@given(
    capacity=st.integers(min_value=1, max_value=12),
    blocks=st.lists(st.integers(min_value=0, max_value=30), max_size=400),
)
@settings(max_examples=300, deadline=None)
def test_hot_blocks_heap_keeps_exactly_the_scans_counters(capacity: int, blocks: list[int]) -> None:
    # Same counters (and so the same top-k) as the O(capacity) scan, tie order included.
    fast, reference = HotBlocks(capacity), _ScanHotBlocks(capacity)
    for block in blocks:
        fast.add(block)
        reference.add(block)
        assert fast.top(capacity) == tuple(
            b for b, _ in sorted(reference.counts.items(), key=lambda i: (-i[1], i[0]))
        )
    assert fast._counts == reference.counts


# ------------------------------------------------------------------ the two forms


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.integers(0, 70),  # slot: past 64, masks span two words
            st.lists(st.integers(0, 40), max_size=14),
            st.integers(-1, 12),  # capacity: none, shrinking, growing
        ),
        st.tuples(st.just("forget"), st.integers(0, 70)),
        st.tuples(st.just("match"), st.lists(st.integers(0, 40), max_size=10)),
    ),
    max_size=60,
)


def test_the_compiled_index_is_built() -> None:
    # Without it the agent runs the dict form, which grows as it fills: CI must not pass
    # on that quietly.
    expected = expected_state()
    assert native.kernel("zone_agent._prefix").state is expected
    assert COMPILED is (expected is not native.KernelState.PYTHON)


@given(ops=_OPS)
@settings(max_examples=400, deadline=None)
def test_compiled_index_gives_what_the_dict_index_gives(ops: list[tuple[object, ...]]) -> None:
    # The pin between the two forms: the same inserts, forgets and queries, the same
    # holders, matches, block counts and sizes after every step.
    compiled, reference = PrefixIndex(), DictPrefixIndex()
    seen: set[int] = set()
    for op in ops:
        if op[0] == "insert":
            _, slot, blocks, capacity = op
            assert isinstance(slot, int)
            assert isinstance(blocks, list)
            assert isinstance(capacity, int)
            chain = tuple(1000 + b for b in blocks)
            compiled.insert(slot, chain, capacity)
            reference.insert(slot, chain, capacity)
            seen.update(chain)
            assert compiled.blocks(slot) == reference.blocks(slot)
        elif op[0] == "forget":
            assert isinstance(op[1], int)
            compiled.forget(op[1])
            reference.forget(op[1])
        else:
            assert isinstance(op[1], list)
            hashes = tuple(1000 + b for b in op[1])
            assert compiled.match_groups(hashes) == reference.match_groups(hashes)
            assert compiled.match(hashes) == reference.match(hashes)
        assert len(compiled) == len(reference)
    for block in seen:
        assert compiled.holders(block) == reference.holders(block)
    for slot in range(72):
        assert compiled.blocks(slot) == reference.blocks(slot)


def test_compiled_index_memory_does_not_grow_with_traffic() -> None:
    # Sized when a slot first gets blocks (by its capacity), then fixed however many
    # blocks come and go; 64-bit hashes as the fingerprints make them.
    if not COMPILED:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        return
    from zone_agent._prefix import PrefixIndex as CompiledIndex

    index = CompiledIndex()
    index.insert(0, (1,), capacity=500)
    index.insert(1, (1,), capacity=500)
    size = index.nbytes
    rng = np.random.default_rng(7)
    for _ in range(400):
        slot = int(rng.integers(0, 2))
        index.insert(slot, tuple(int(h) for h in rng.integers(0, 2**63, 16)), 500)
    assert index.blocks(0) == index.blocks(1) == 500
    assert index.nbytes == size
    # A GPU whose capacity grows gets a new range: the one time the index grows.
    index.insert(0, (2,), capacity=600)
    assert index.nbytes > size
    assert index.blocks(0) == 501


def test_compiled_index_takes_blocks_modulo_2_64_and_refuses_non_ints() -> None:
    if not COMPILED:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        return
    index = PrefixIndex()
    index.insert(0, (2**64 + 5,), capacity=4)
    assert index.holders(5) == 1
    with pytest.raises(TypeError, match="ints"):
        index.insert(0, (1, "x"), capacity=4)  # type: ignore[arg-type]
    assert index.blocks(0) == 1  # a bad block changes nothing
    with pytest.raises(ValueError, match="slot"):
        index.insert(-1, (1,), capacity=4)

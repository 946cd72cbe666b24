"""The dispatch-side placement memory: where a prompt's prefix was last sent."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm import native
from gtm.routing.placement import COMPILED, DictPlacementMemory, PlacementMemory, Recall
from gtm.testing.kernels import expected_state

TURN_1 = (11, 12, 13, 14)
#: The next turn of the same conversation: the whole previous prompt, then more.
TURN_2 = (*TURN_1, 15, 16)


def test_a_repeat_right_after_dispatch_recalls_where_it_went() -> None:
    memory = PlacementMemory()
    assert memory.recall(TURN_1, 0.0) is None
    memory.remember(TURN_1, "gpu-3", 1.0, tokens=2048)
    assert memory.recall(TURN_1, 1.5) == Recall("gpu-3", 4, 1.0, 2048)
    # The next turn extends the prompt: its first four blocks went there.
    assert memory.recall(TURN_2, 2.0) == Recall("gpu-3", 4, 1.0, 2048)
    assert memory.recall((99, *TURN_1), 2.0) is None  # prefix-chained: no shared start


def test_the_deepest_block_names_the_target_and_the_latest_send_wins() -> None:
    memory = PlacementMemory()
    memory.remember((1, 2), "a", 1.0)  # a shared system prompt
    memory.remember((1, 2, 3, 4), "b", 2.0)  # a conversation starting with it
    assert memory.recall((1, 2, 3, 4, 5), 3.0) == Recall("b", 4, 2.0)
    assert memory.recall((1, 2, 9), 3.0) == Recall("b", 2, 2.0)  # block 2 last went to b
    memory.remember((1, 2, 3, 4, 5), "c", 4.0)  # the conversation had to move
    assert memory.recall((1, 2, 3, 4, 5, 6), 5.0) == Recall("c", 5, 4.0)


def test_an_entry_past_its_ttl_is_not_recalled_and_is_dropped() -> None:
    memory = PlacementMemory(ttl_s=10.0)
    memory.remember(TURN_1, "gpu-1", 0.0)
    assert memory.recall(TURN_1, 9.9) is not None
    assert memory.recall(TURN_1, 10.0) is None
    memory.remember((7,), "gpu-2", 10.0)
    assert len(memory) == 1  # the expired blocks went when the new ones came
    memory.expire(25.0)
    assert len(memory) == 0


def test_capacity_bounds_the_memory_and_evicts_prompts_from_their_deep_end() -> None:
    memory = PlacementMemory(capacity=6)
    memory.remember(TURN_1, "gpu-1", 1.0)
    memory.remember((21, 22, 23), "gpu-2", 2.0)
    assert len(memory) == 6
    # One block too many: TURN_1's deepest went, its shallow ones are still recalled.
    assert memory.recall(TURN_1, 3.0) == Recall("gpu-1", 3, 1.0)
    assert memory.recall((21, 22, 23), 3.0) == Recall("gpu-2", 3, 2.0)
    for k in range(1000):
        memory.remember((1000 + k, 2000 + k), f"gpu-{k % 5}", 4.0 + k)
    assert len(memory) == 6  # flat, however long it runs
    assert memory.recall(TURN_1, 2000.0) is None


def test_forget_drops_every_block_sent_to_a_target() -> None:
    memory = PlacementMemory()
    memory.remember(TURN_1, "gpu-1", 1.0)
    memory.remember((31, 32), "gpu-2", 1.0)
    memory.forget("gpu-1")
    assert memory.recall(TURN_1, 2.0) is None
    assert memory.recall((31, 32), 2.0) == Recall("gpu-2", 2, 1.0)


def test_share_of_a_prompt() -> None:
    assert Recall("x", 3, 0.0).share(12) == 0.25
    assert Recall("x", 3, 0.0).share(2) == 1.0
    assert Recall("x", 3, 0.0).share(0) == 0.0


@pytest.mark.parametrize(("capacity", "ttl"), [(0, 1.0), (1, 0.0), (1, float("inf"))])
def test_bad_bounds_are_refused(capacity: int, ttl: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        PlacementMemory(capacity, ttl)


def test_held_tokens_are_the_recalled_blocks_or_the_previous_prompt_past_the_fingerprint() -> None:
    # 4 of a request's 8 fingerprinted blocks of 100 tokens: those blocks.
    assert Recall("z", 4, 0.0, 9_000).held_tokens(20_000, 8, 100.0) == 400.0
    # Every fingerprinted block: the fingerprint says nothing of where the prompts part,
    # and a next turn repeats its previous prompt whole.
    assert Recall("z", 8, 0.0, 9_000).held_tokens(20_000, 8, 100.0) == 9_000.0
    # Never more than the request's prompt; without the previous prompt's size, blocks.
    assert Recall("z", 8, 0.0, 30_000).held_tokens(20_000, 8, 100.0) == 20_000.0
    assert Recall("z", 8, 0.0).held_tokens(20_000, 8, 100.0) == 800.0
    # Another count of matched blocks (a sketch's) may stand for the recalled one.
    assert Recall("z", 4, 0.0, 9_000).held_tokens(20_000, 8, 100.0, 6) == 600.0


# ------------------------------------------------------------------ the two forms


def test_the_compiled_memory_is_built() -> None:
    # Without it the tiers run the dict form, whose memory follows the request rate up:
    # CI must not pass on that quietly.
    expected = expected_state()
    assert native.kernel("gtm.routing._placement").state is expected
    assert COMPILED is (expected is not native.KernelState.PYTHON)


_CALLS = st.lists(
    st.one_of(
        st.tuples(
            st.just("remember"),
            st.lists(st.integers(0, 30), max_size=12),
            st.sampled_from(["a", "b", "c"]),
            st.floats(0.0, 3.0),  # time passes by this much first
            st.integers(0, 5000),
        ),
        st.tuples(st.just("recall"), st.lists(st.integers(0, 30), max_size=12), st.floats(0, 3)),
        st.tuples(st.just("forget"), st.sampled_from(["a", "b", "c", "d"])),
        st.tuples(st.just("expire"), st.floats(0.0, 3.0)),
    ),
    max_size=60,
)


@given(calls=_CALLS, capacity=st.integers(1, 24), ttl=st.sampled_from([0.5, 2.0, 300.0]))
@settings(max_examples=400, deadline=None)
def test_compiled_memory_gives_what_the_dict_memory_gives(
    calls: list[tuple[object, ...]], capacity: int, ttl: float
) -> None:
    # The pin between the two forms: the same calls at the same times, the same recalls
    # and sizes after every one.
    compiled, reference = PlacementMemory(capacity, ttl), DictPlacementMemory(capacity, ttl)
    now = 0.0
    for call in calls:
        if call[0] == "remember":
            _, blocks, target, step, tokens = call
            assert isinstance(blocks, list)
            assert isinstance(target, str)
            assert isinstance(step, float)
            assert isinstance(tokens, int)
            now += step
            hashes = [1000 + b for b in blocks]
            compiled.remember(hashes, target, now, tokens)
            reference.remember(hashes, target, now, tokens)
        elif call[0] == "recall":
            _, blocks, step = call
            assert isinstance(blocks, list)
            assert isinstance(step, float)
            hashes = [1000 + b for b in blocks]
            assert compiled.recall(hashes, now + step) == reference.recall(hashes, now + step)
        elif call[0] == "forget":
            assert isinstance(call[1], str)
            compiled.forget(call[1])
            reference.forget(call[1])
        else:
            assert isinstance(call[1], float)
            now += call[1]
            compiled.expire(now)
            reference.expire(now)
        assert len(compiled) == len(reference)
    for block in range(1000, 1031):
        assert compiled.recall([block], now) == reference.recall([block], now)


def test_compiled_memory_does_not_grow_with_traffic() -> None:
    if not COMPILED:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        return
    from gtm.routing._placement import PlacementCore

    memory = PlacementCore(5_000, 1e9)
    size = memory.nbytes
    rng = np.random.default_rng(3)
    for i in range(2_000):
        memory.remember([int(h) for h in rng.integers(0, 2**63, 16)], f"r{i % 7}", float(i))
    assert len(memory) == 5_000
    assert memory.nbytes == size
    with pytest.raises(TypeError, match="ints"):
        memory.remember([1, "x"], "r0", 2_001.0)  # type: ignore[list-item]

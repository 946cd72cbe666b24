"""The dispatch-side placement memory: where a prompt's prefix was last sent."""

from __future__ import annotations

import pytest

from gtm.routing.placement import PlacementMemory, Recall

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

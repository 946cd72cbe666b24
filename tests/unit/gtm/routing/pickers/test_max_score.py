from __future__ import annotations

import numpy as np
import pytest

from gtm.routing import Capability, Picker, capabilities_of
from gtm.routing.pickers.max_score import TYPE_NAME, MaxScorePicker, Params, build
from tests.unit.gtm.routing.helpers import batch, pick, request


@pytest.mark.parametrize(
    ("case", "pairs", "expected"),
    [
        ("single", [("a", 0.1)], "a"),
        ("highest wins", [("a", 0.2), ("b", 0.9), ("c", 0.5)], "b"),
        ("tie goes to smallest id", [("c", 0.7), ("b", 0.7), ("a", 0.1)], "b"),
        ("all zero", [("z", 0.0), ("y", 0.0)], "y"),
        ("ids compare as strings", [("gpu-10", 1.0), ("gpu-9", 1.0)], "gpu-10"),
    ],
)
def test_max_score(case: str, pairs: list[tuple[str, float]], expected: str) -> None:
    picker = MaxScorePicker()
    assert pick(picker, pairs, request()) == expected, case
    assert pick(picker, list(reversed(pairs)), request()) == expected, case


def test_name_params_and_protocol() -> None:
    picker = MaxScorePicker("best", Params())
    assert picker.name == "best"
    assert MaxScorePicker().name == TYPE_NAME
    assert isinstance(picker, Picker)


def test_ties_among_survivors_go_to_the_smallest_id_in_any_order() -> None:
    chosen = batch("c", "a", "b", "d")
    chosen.alive[1] = False  # "a" was filtered out: its total does not count
    chosen.all_alive = False
    chosen.seal()
    totals = np.array([0.7, 0.9, 0.7, 0.1])
    assert chosen.ids[MaxScorePicker().pick(chosen, totals)] == "b"


def test_near_equal_draws_between_the_close_ones_and_drops_the_fast_path_capability() -> None:
    near = build("near", Params(near_equal=0.1, seed=1))
    assert Capability.PICKS_MAX_TOTAL in capabilities_of(build("plain", Params()))
    assert Capability.PICKS_MAX_TOTAL not in capabilities_of(near)
    # The better of two drawn among a, b and c (within 0.1 of the best): never c or d.
    pairs = [("a", 0.95), ("b", 0.9), ("c", 0.88), ("d", 0.1)]
    picked = {pick(near, pairs, request(f"r{i}")) for i in range(40)}
    assert picked == {"a", "b"}

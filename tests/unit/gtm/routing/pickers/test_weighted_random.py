from __future__ import annotations

import random
from collections import Counter

import pytest

from gtm.routing import Picker
from gtm.routing.framework import HasRequestId
from gtm.routing.pickers.weighted_random import TYPE_NAME, Params, WeightedRandomPicker
from tests.unit.gtm.routing.helpers import pick, request


def _fixed(draw: float) -> WeightedRandomPicker:
    class Fixed(random.Random):
        def random(self) -> float:
            return draw

    def rng_for(req: HasRequestId, seed: int) -> random.Random:
        return Fixed()

    return WeightedRandomPicker(rng_for=rng_for)


@pytest.mark.parametrize(
    ("case", "draw", "pairs", "expected"),
    [
        # mass 1.0: a covers [0, 0.2), b [0.2, 0.2) is empty, c [0.2, 1.0)
        ("first slice", 0.1, [("a", 0.2), ("b", 0.0), ("c", 0.8)], "a"),
        ("zero total never hit", 0.2, [("a", 0.2), ("b", 0.0), ("c", 0.8)], "c"),
        ("top of range", 0.999999, [("a", 0.2), ("b", 0.0), ("c", 0.8)], "c"),
        ("trailing zero skipped", 0.999999, [("a", 0.5), ("b", 0.5), ("c", 0.0)], "b"),
        ("all zero is uniform", 0.5, [("a", 0.0), ("b", 0.0), ("c", 0.0), ("d", 0.0)], "c"),
    ],
)
def test_weighted_random(
    case: str, draw: float, pairs: list[tuple[str, float]], expected: str
) -> None:
    assert pick(_fixed(draw), pairs, request()) == expected, case


def test_rounding_overshoot_falls_back_to_the_last_positive_candidate() -> None:
    # A draw of exactly 1.0 cannot come from random(), but rounding can get that close.
    assert pick(_fixed(1.0), [("a", 0.3), ("b", 0.7), ("c", 0.0)], request()) == "b"


def test_frequencies_follow_totals() -> None:
    pairs = [("a", 0.1), ("b", 0.3), ("c", 0.6), ("d", 0.0)]
    picker = WeightedRandomPicker()
    n = 5000
    counts = Counter(pick(picker, pairs, request(f"r{i}")) for i in range(n))
    assert counts["d"] == 0
    for cid, total in pairs[:3]:
        assert counts[cid] / n == pytest.approx(total, abs=0.03)


def test_deterministic_per_request_and_seed() -> None:
    pairs = [("a", 0.5), ("b", 0.5)]
    once = [pick(WeightedRandomPicker(), pairs, request(f"r{i}")) for i in range(40)]
    again = [pick(WeightedRandomPicker(), pairs, request(f"r{i}")) for i in range(40)]
    other = [
        pick(WeightedRandomPicker(params=Params(seed=9)), pairs, request(f"r{i}"))
        for i in range(40)
    ]
    assert once == again
    assert once != other


def test_name_and_protocol() -> None:
    assert WeightedRandomPicker().name == TYPE_NAME
    assert isinstance(WeightedRandomPicker(), Picker)

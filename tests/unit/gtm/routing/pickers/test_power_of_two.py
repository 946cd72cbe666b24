from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import pytest

from gtm.routing import Picker
from gtm.routing.framework import HasRequestId
from gtm.routing.pickers.power_of_two import TYPE_NAME, Params, PowerOfTwoPicker
from tests.unit.gtm.routing.helpers import pick, request


def _draws(*values: float) -> Iterator[float]:
    yield from values


def _rng(*values: float) -> random.Random:
    draws = _draws(*values)

    class Scripted(random.Random):
        def random(self) -> float:
            return next(draws)

    return Scripted()


@pytest.mark.parametrize(
    ("case", "draws", "pairs", "expected"),
    [
        # 4 candidates: first = int(d0·4), second = int(d1·3), shifted past first.
        ("better of a and c", (0.0, 0.5), [("a", 0.1), ("b", 0.9), ("c", 0.5), ("d", 0.0)], "c"),
        # first = b (index 1); second draws index 1 of the other three, i.e. c.
        ("second skips first", (0.3, 0.4), [("a", 0.9), ("b", 0.2), ("c", 0.5), ("d", 0.0)], "c"),
        ("same draw, distinct", (0.0, 0.0), [("a", 0.1), ("b", 0.9)], "b"),
        ("tie to smaller id", (0.5, 0.0), [("b", 0.5), ("a", 0.5), ("c", 0.1)], "a"),
    ],
)
def test_power_of_two(
    case: str, draws: tuple[float, ...], pairs: list[tuple[str, float]], expected: str
) -> None:
    def rng_for(req: HasRequestId, seed: int) -> random.Random:
        return _rng(*draws)

    picker = PowerOfTwoPicker(rng_for=rng_for)
    assert pick(picker, pairs, request()) == expected, case


def test_single_candidate_needs_no_randomness() -> None:
    def rng_for(req: HasRequestId, seed: int) -> random.Random:
        raise AssertionError("no draw needed")

    picker = PowerOfTwoPicker(rng_for=rng_for)
    assert pick(picker, [("only", 0.0)], request()) == "only"


def test_never_picks_the_worst_and_favours_the_best() -> None:
    pairs = [("a", 0.1), ("b", 0.4), ("c", 0.7), ("d", 0.9)]
    picker = PowerOfTwoPicker()
    counts = Counter(pick(picker, pairs, request(f"r{i}")) for i in range(3000))
    # P(rank k of n wins) = 2(k-1)/(n(n-1)): 0, 1/6, 2/6, 3/6 for n = 4.
    assert counts["a"] == 0
    assert counts["b"] < counts["c"] < counts["d"]
    assert counts["d"] == pytest.approx(1500, abs=120)


def test_deterministic_per_request_and_seed() -> None:
    pairs = [(f"n{i}", i / 10) for i in range(10)]
    once = [pick(PowerOfTwoPicker(), pairs, request(f"r{i}")) for i in range(40)]
    again = [pick(PowerOfTwoPicker(), pairs, request(f"r{i}")) for i in range(40)]
    other = [
        pick(PowerOfTwoPicker(params=Params(seed=1)), pairs, request(f"r{i}")) for i in range(40)
    ]
    assert once == again
    assert once != other


def test_name_and_protocol() -> None:
    assert PowerOfTwoPicker().name == TYPE_NAME
    assert isinstance(PowerOfTwoPicker(), Picker)

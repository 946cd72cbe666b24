from __future__ import annotations

import random
from collections import Counter

import pytest

from gtm.routing import Picker
from gtm.routing.framework import HasRequestId
from gtm.routing.pickers.random_pick import TYPE_NAME, Params, RandomPicker
from tests.unit.gtm.routing.helpers import pick, request

PAIRS = [("a", 0.0), ("b", 1.0), ("c", 0.5), ("d", 0.2)]


def test_same_request_same_choice_across_instances() -> None:
    first = [pick(RandomPicker(), PAIRS, request(f"r{i}")) for i in range(50)]
    again = [pick(RandomPicker(), PAIRS, request(f"r{i}")) for i in range(50)]
    assert first == again


def test_ignores_scores_and_covers_every_candidate_about_evenly() -> None:
    picker = RandomPicker()
    counts = Counter(pick(picker, PAIRS, request(f"r{i}")) for i in range(4000))
    assert set(counts) == {"a", "b", "c", "d"}
    for count in counts.values():
        assert 850 <= count <= 1150  # 1000 expected; binomial sd ≈ 27


def test_seed_reshuffles_choices() -> None:
    default = [pick(RandomPicker(), PAIRS, request(f"r{i}")) for i in range(50)]
    seeded = [pick(RandomPicker(params=Params(seed=7)), PAIRS, request(f"r{i}")) for i in range(50)]
    assert default != seeded


@pytest.mark.parametrize(("draw", "expected"), [(0.0, "a"), (0.49, "b"), (0.99999, "d")])
def test_uses_the_injected_random_source(draw: float, expected: str) -> None:
    calls: list[tuple[str, int]] = []

    class Fixed(random.Random):
        def random(self) -> float:
            return draw

    def rng_for(req: HasRequestId, seed: int) -> random.Random:
        calls.append((req.request_id, seed))
        return Fixed()

    picker = RandomPicker("rnd", Params(seed=3), rng_for=rng_for)
    assert pick(picker, PAIRS, request("r-1")) == expected
    assert calls == [("r-1", 3)]


def test_name_and_protocol() -> None:
    assert RandomPicker().name == TYPE_NAME
    assert isinstance(RandomPicker(), Picker)

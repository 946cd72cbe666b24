"""The core's columnar pickers over the zone's layout (positions in id order)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from gtm.routing.framework import Picker
from gtm.routing.pickers import max_score
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.routing.pickers.power_of_two import PowerOfTwoPicker
from gtm.routing.pickers.random_pick import RandomPicker
from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view

VIEW = make_view([Gpu(f"g{i}") for i in range(4)])


def _pick(
    picker: Picker, totals: list[float], dead: tuple[int, ...] = (), request_id: str = "r"
) -> int:
    b = batch(VIEW, make_request(request_id=request_id))
    if dead:
        b.alive = np.array([i not in dead for i in range(len(b))])
        b.all_alive = False
    return picker.pick(b, np.array(totals, dtype=np.float64))


def test_max_score_ties_go_to_the_smallest_id_and_dead_never_win() -> None:
    assert _pick(MaxScorePicker(), [0.5, 0.9, 0.9, 0.1]) == 1
    assert _pick(MaxScorePicker(), [0.5, 0.9, 0.9, 0.1], dead=(1,)) == 2
    assert _pick(MaxScorePicker(), [1.0, 0.2, 0.1, 0.0], dead=(0,)) == 1


def test_near_equal_spreads_among_close_candidates_only() -> None:
    picker = max_score.build("max-score-picker", max_score.Params(near_equal=0.05))
    picks = Counter(_pick(picker, [0.99, 1.0, 0.98, 0.2], request_id=f"r{i}") for i in range(300))
    # The better of two among the close ones: the best often, the second too, never
    # the worst of the close set nor anything outside it.
    assert set(picks) == {0, 1}
    assert _pick(picker, [0.99, 1.0, 0.98, 0.2], request_id="x") == _pick(
        picker, [0.99, 1.0, 0.98, 0.2], request_id="x"
    )


def test_power_of_two_never_picks_the_worst_and_is_deterministic() -> None:
    picks = Counter(
        _pick(PowerOfTwoPicker(), [0.4, 0.3, 0.2, 0.1], request_id=f"r{i}") for i in range(300)
    )
    assert 3 not in picks
    assert _pick(PowerOfTwoPicker(), [0.1] * 4, dead=(0, 1, 2)) == 3


def test_random_is_uniformish_over_survivors() -> None:
    picks = Counter(
        _pick(RandomPicker(), [0.0] * 4, dead=(2,), request_id=f"r{i}") for i in range(600)
    )
    assert set(picks) == {0, 1, 3}
    assert min(picks.values()) > 150

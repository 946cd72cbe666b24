"""zone_agent.costs.slo: the late-placement rule's scalar reference and numpy form choose
alike on random zones, and the rule does what its docstring says on hand-made ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zone_agent.costs.slo import (
    NO_CHOICE,
    is_late_numpy,
    late_choice_numpy,
    late_choice_reference,
)

SLO, CAP = 2_000.0, 10_000.0
COSTS = st.one_of(st.floats(0.0, 30_000.0), st.just(math.inf), st.just(SLO), st.just(CAP))


@st.composite
def zones(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    n = draw(st.integers(1, 12))
    costs = np.array(draw(st.lists(COSTS, min_size=n, max_size=n)))
    alone = np.array(draw(st.lists(st.floats(0.0, 8_000.0), min_size=n, max_size=n)))
    alone = np.minimum(alone, costs)  # the prompt alone never costs more than with a queue
    ramp = np.array(draw(st.lists(st.sampled_from([0.1, 0.5, 1.0]), min_size=n, max_size=n)))
    survivors = None
    if draw(st.booleans()):
        keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        keep[draw(st.integers(0, n - 1))] = True
        survivors = np.flatnonzero(keep)
    return costs, alone, ramp, survivors


@settings(max_examples=300, deadline=None)
@given(zone=zones())
def test_the_numpy_form_chooses_as_the_reference(
    zone: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None],
) -> None:
    costs, alone, ramp, survivors = zone
    expected = late_choice_reference(costs, alone, ramp, survivors, SLO, CAP)
    assert late_choice_numpy(costs, alone, ramp, survivors, SLO, CAP) == expected
    late = is_late_numpy(costs, ramp, survivors, SLO)
    if expected != NO_CHOICE:
        assert late  # the cheap test never hides a choice
        live = range(len(costs)) if survivors is None else survivors.tolist()
        assert expected in live


def choose(costs: list[float], alone: list[float] | None = None, ramp: list[float] | None = None,
           survivors: list[int] | None = None) -> int:  # fmt: skip
    n = len(costs)
    args = (
        np.array(costs),
        np.array(alone if alone is not None else [500.0] * n),
        np.array(ramp if ramp is not None else [1.0] * n),
        None if survivors is None else np.array(survivors),
        SLO,
        CAP,
    )
    reference = late_choice_reference(*args)
    assert late_choice_numpy(*args) == reference
    return reference


def test_on_time_somewhere_makes_no_choice() -> None:
    assert choose([1_500.0, 6_000.0]) == NO_CHOICE
    assert choose([SLO, 6_000.0]) == NO_CHOICE  # exactly at the SLO is on time


def test_late_everywhere_goes_where_the_lateness_is_within_the_cap() -> None:
    assert choose([3_000.0, 7_000.0, 12_000.0]) == 1  # 12 s is beyond the cap
    assert choose([3_000.0, CAP]) == 1  # the cap itself is within


def test_ties_go_to_the_first() -> None:
    assert choose([4_000.0, 4_000.0, 3_000.0]) == 0


def test_a_prompt_late_by_itself_everywhere_makes_no_choice() -> None:
    """A long prompt misses the SLO on an idle GPU: its own TTFT (the tail) decides."""
    assert choose([5_000.0, 7_000.0], alone=[2_500.0, 3_000.0]) == NO_CHOICE
    # Late by itself on one GPU only: the queue is the lateness elsewhere.
    assert choose([5_000.0, 7_000.0], alone=[1_000.0, 3_000.0]) == 1


def test_nothing_within_the_cap_makes_no_choice() -> None:
    assert choose([11_000.0, math.inf]) == NO_CHOICE


def test_slow_start_is_taken_out_of_the_prediction() -> None:
    """A zone that just came up (ramp 0.1 everywhere) predicts 10× what it will take:
    3 s at ramp 0.1 is 300 ms, on time."""
    assert choose([3_000.0, 30_000.0], ramp=[0.1, 0.1]) == NO_CHOICE
    # Beyond the cap as predicted, within it without the ramp.
    assert choose([25_000.0, 50_000.0], ramp=[0.2, 0.2]) == 1


def test_only_survivors_count() -> None:
    assert choose([1_000.0, 3_000.0, 7_000.0], survivors=[1, 2]) == 2
    assert choose([1_000.0, 3_000.0, 7_000.0], survivors=[0, 2]) == NO_CHOICE


@pytest.mark.parametrize("bad", [math.nan])
def test_a_nan_prediction_is_no_verdict(bad: float) -> None:
    assert choose([bad, 7_000.0]) == NO_CHOICE
    assert choose([3_000.0, 7_000.0], alone=[bad, bad]) == 1  # NaN alone: not "late by itself"

"""zone_agent._blend: built in CI, and choosing what the numpy operations choose."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gtm import native
from gtm.testing.kernels import expected_state
from zone_agent.pipeline import Batch, BlendPick, blend_choice
from zone_agent.plugins.kv_cache_utilization_scorer import KvCacheUtilizationScorer
from zone_agent.plugins.ttft_cost import Params, TtftCost

from .test_fast_paths import SETTINGS, zones


def test_the_blend_kernel_is_built() -> None:
    # Without it the default profile decides with numpy, ~6 µs slower at 64 GPUs
    # (bench/zone_decision.py): CI must not pass on that quietly.
    expected = expected_state()
    assert native.kernel("zone_agent._blend").state is expected
    assert (blend_choice is None) is (expected is native.KernelState.PYTHON)


def picks(cost_weight: float, room_weight: float, scale_ms: float) -> tuple[BlendPick, ...]:
    made = []
    for kernel in (True, False):
        ttft = TtftCost("ttft", Params(scale_ms=scale_ms))
        made.append(
            BlendPick(ttft, cost_weight, KvCacheUtilizationScorer("kv"), room_weight, kernel=kernel)
        )
    return tuple(made)


@SETTINGS
@given(
    zone=zones(),
    weights=st.sampled_from([(1.0, 1.0), (2.0, 1.0), (1.0, 3.0), (0.5, 0.25)]),
    scale_ms=st.sampled_from([1.0, 250.0, 5_000.0]),
)
def test_the_kernel_chooses_what_numpy_chooses(
    zone: tuple[Batch, np.random.Generator], weights: tuple[float, float], scale_ms: float
) -> None:
    b, _ = zone
    with_kernel, with_numpy = picks(*weights, scale_ms)
    if not b.all_alive:
        b.seal()
    if not b.all_alive and not b.alive.any():
        return  # the runner refuses before any scorer runs
    expected = with_numpy.choose(b)
    b.memo.clear()
    assert with_kernel.choose(b) == expected
    assert b.alive[expected]


def test_a_near_tie_or_bad_input_leaves_the_choice_to_numpy() -> None:
    if blend_choice is None:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        return
    ones, zeros = np.ones(3), np.zeros(3)
    slots = np.arange(3, dtype=np.int64)
    args = (ones, zeros, slots, zeros, ones, ones)
    # Equal costs and equal room: an exact tie, numpy decides (first of the maxima).
    assert blend_choice(np.full(3, 5.0), *args[1:], None, 0.004, 1.0, 1.0, 0.0) == -1
    costs = np.array([5.0, 4.0, 6.0])
    assert blend_choice(costs, *args[1:], None, 0.004, 1.0, 1.0, 0.0) == 1
    survivors = np.array([0, 2], dtype=np.int64)
    assert blend_choice(costs, *args[1:], survivors, 0.004, 1.0, 1.0, 0.0) == 0
    nan_costs = np.array([5.0, np.nan, 6.0])
    assert blend_choice(nan_costs, *args[1:], None, 0.004, 1.0, 1.0, 0.0) == -1
    infinite = np.full(3, np.inf)
    assert blend_choice(infinite, *args[1:], None, 0.004, 1.0, 1.0, 0.0) == -1
    with pytest.raises(TypeError, match="costs"):
        blend_choice(np.ones((2, 2)), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="costs: a 1-D array of float64"):
        blend_choice(np.ones(3, dtype=np.float32), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="costs: a 1-D array of float64"):
        blend_choice(np.ones(3, dtype=np.int64), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="slots: a 1-D array of int64"):
        blend_choice(costs, zeros, np.ones(3), zeros, ones, ones, None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="different lengths"):
        blend_choice(np.ones(4), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(IndexError, match="survivor"):
        blend_choice(costs, *args[1:], np.array([7], dtype=np.int64), 0.004, 1.0, 1.0, 0.0)
    bad_slots = np.array([0, 1, 9], dtype=np.int64)
    with pytest.raises(IndexError, match="slot"):
        blend_choice(costs, zeros, bad_slots, zeros, ones, ones, None, 0.004, 1.0, 1.0, 0.0)

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
from zone_agent.plugins.ttft_cost import Params, TtftCost, ttft_costs

from .test_fast_paths import SETTINGS, zones


def test_the_blend_kernel_is_built() -> None:
    # Without it the default profile decides with numpy, ~6 µs slower at 64 GPUs
    # (bench/zone_decision.py): CI must not pass on that quietly.
    expected = expected_state()
    assert native.kernel("zone_agent._blend").state is expected
    assert (blend_choice is None) is (expected is native.KernelState.PYTHON)
    assert (ttft_costs is None) is (expected is native.KernelState.PYTHON)


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


@SETTINGS
@given(
    zone=zones(),
    epsilon=st.sampled_from([0.01, 0.25, 4.0]),
    decode=st.booleans(),
    sparse_max=st.sampled_from([0, 16]),
)
def test_the_cost_kernel_gives_the_numpy_costs_to_the_bit(
    zone: tuple[Batch, np.random.Generator], epsilon: float, decode: bool, sparse_max: int
) -> None:
    # Both numpy forms (one float at a time for a few holders of the prompt, whole
    # arrays for many: sparse_max 0 takes the arrays always) against the kernel.
    b, _ = zone
    if not b.all_alive:
        b.seal()
    params = Params(bounded_load_epsilon=epsilon, decode_pressure=decode)
    expected = TtftCost("ttft", params, sparse_max=sparse_max, kernel=False).costs_ms(b)
    b.memo.clear()
    got = TtftCost("ttft", params, kernel=True).costs_ms(b)
    assert got.tobytes() == expected.tobytes()


def test_the_cost_kernel_refuses_bad_input() -> None:
    if ttft_costs is None:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        return
    ones, slots = np.ones(3), np.arange(3, dtype=np.int64)

    def call(out: object = None, slots: object = slots, matches: object = None) -> None:
        assert ttft_costs is not None
        ttft_costs(
            np.empty(3) if out is None else out, ones, ones, slots, ones, ones, ones, ones,
            ones, {} if matches is None else matches, 100.0, 16.0, 1.0, 2.0, True,
        )  # fmt: skip

    out = np.empty(3)
    call(out)
    # (1 + 1 + 100) tokens × 1 ms, + ceil(102 × 1) passes × 1 ms.
    assert out.tolist() == [204.0, 204.0, 204.0]
    with pytest.raises(TypeError, match="out: a writable 1-D array of float64"):
        call(np.empty(3, dtype=np.float32))
    read_only = np.empty(3)
    read_only.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        call(read_only)
    with pytest.raises(TypeError, match="slots: a 1-D array of int64"):
        call(slots=np.ones(3))
    with pytest.raises(IndexError, match="slot out of range"):
        call(slots=np.array([0, 1, 9], dtype=np.int64))
    with pytest.raises(IndexError, match="match position out of range"):
        call(matches={5: 1})
    with pytest.raises(TypeError, match="matches must be a dict or a list"):
        call(matches=((0, 1),))
    with pytest.raises(TypeError, match="a match group is a"):
        call(matches=[(1, 1)])
    with pytest.raises(IndexError, match="match position out of range"):
        call(matches=[(1, (1 << 5).to_bytes(1, "little"))])
    # A group: positions 0 and 2 hold one block of 16 tokens (and have room under the cap:
    # 1 stream + 1 ≤ ceil(2 × 1)): 100 → 84 prompt tokens to prefill there.
    grouped, keyed = np.empty(3), np.empty(3)
    call(grouped, matches=[(1, (0b101).to_bytes(1, "little"))])
    call(keyed, matches={0: 1, 2: 1})
    assert grouped.tolist() == keyed.tolist() == [172.0, 204.0, 172.0]
    with pytest.raises(ValueError, match="different lengths"):
        call(np.empty(4))

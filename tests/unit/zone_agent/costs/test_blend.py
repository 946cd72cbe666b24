"""zone_agent.costs.blend: its three forms choose the same GPU.

The scalar reference works each survivor's total out one GPU at a time with
:func:`math.exp`, the C library's ``exp`` the kernel calls, so the kernel's totals are
the reference's to the bit and its choice is the reference's — or -1 exactly when the
best two are within ``NEAR_TIE`` (or no cost is finite). numpy's ``exp`` may differ in
the last bit: its totals are held to a few ulps and its choice to the reference's
outside near ties.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtm import native
from gtm.testing.kernels import expected_state
from zone_agent.costs.blend import (
    NEAR_TIE,
    Kernel,
    blend_choice,
    blend_choice_numpy,
    blend_totals,
    blend_totals_reference,
    first_max,
    free_blocks,
    kv_floor_numpy,
    new_floor_form,
    new_form,
    room,
    ttft_scores,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Args = tuple[object, ...]

#: One kernel object for every example: it holds one example's arrays into the next.
HELD = new_form()


@st.composite
def inputs(draw: st.DrawFn) -> Args:
    """The kernel's arguments for a random model of a random zone."""
    n = draw(st.integers(1, 90))
    slot_count = n + draw(st.integers(0, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    slots = rng.permutation(slot_count)[:n].astype(np.int64)
    # Few distinct costs and KV figures, so ties and near ties happen.
    costs = rng.choice([100.0, 100.0 + 1e-11, 250.0, 1_000.0, 4_321.5, math.inf], n)
    costs = costs + draw(st.sampled_from([0.0, 1.0])) * rng.random(n) * 500.0
    kv_blocks = rng.integers(0, 3_000, slot_count).astype(np.float64)
    own_base = rng.integers(0, 3_000, n).astype(np.float64)
    total = rng.choice([1.0, 1_000.0, 20_000.0], n)
    free_base = np.minimum(total, rng.integers(0, 25_000, n).astype(np.float64))
    inv_total = 1.0 / np.maximum(total, 1.0)
    survivors = None
    if draw(st.booleans()):
        survivors = np.flatnonzero(rng.random(n) < 0.7).astype(np.int64)
        if not len(survivors):
            survivors = np.array([int(rng.integers(n))], dtype=np.int64)
    inv_scale = 1.0 / draw(st.sampled_from([1.0, 250.0, 2_000.0, 5_000.0]))
    weights = draw(st.sampled_from([(1.0, 1.0), (2.0, 1.0), (1.0, 3.0), (0.5, 0.25)]))
    div = sum(weights) if draw(st.booleans()) else 0.0
    return (
        costs, kv_blocks, slots, own_base, free_base, inv_total, survivors, inv_scale,
        *weights, div,
    )  # fmt: skip


def test_the_kernel_is_built() -> None:
    # Without it the default profile decides with numpy: CI must not pass on that quietly.
    expected = expected_state()
    assert native.kernel("zone_agent.costs._blend").state is expected
    assert (blend_choice is None) is (expected is native.KernelState.PYTHON)


@SETTINGS
@given(args=inputs())
def test_every_form_chooses_the_reference_choice(args: Args) -> None:
    totals = blend_totals_reference(*args)  # type: ignore[arg-type]
    choice = first_max(totals)
    ranked = sorted(totals.values(), reverse=True)
    clear = len(ranked) == 1 or ranked[1] < ranked[0] - NEAR_TIE
    costs, survivors = args[0], args[6]
    finite = any(math.isfinite(costs[p]) for p in totals)  # type: ignore[index]
    # A near tie among survivors of exactly the best cost: exp(0) in every form, the
    # same totals to the bit, and the kernel decides it.
    cheapest = min(costs[p] for p in totals)  # type: ignore[index]
    exact = all(costs[p] == cheapest for p in totals if totals[p] >= ranked[0] - NEAR_TIE)  # type: ignore[index]
    assert blend_choice_numpy(*args) == choice or not (clear or exact)  # type: ignore[arg-type]
    if blend_choice is not None:
        assert blend_choice(*args) == (choice if (clear or exact) and finite else -1)
        assert HELD(*args) == HELD(*args) == blend_choice(*args)  # held, then every array
    # numpy's totals, a few ulps from the reference's.
    costs_a, kv, slots, own_base, free_base, inv_total = args[:6]
    live = list(totals)
    best = min(costs_a[p] for p in live)  # type: ignore[index]
    if best < math.inf:
        scores = ttft_scores(costs_a, best, args[7], survivors is not None)  # type: ignore[arg-type]
    else:
        scores = np.zeros(len(costs_a))  # type: ignore[arg-type]
    rooms = room(free_blocks(kv[slots], own_base, free_base), inv_total)  # type: ignore[index, arg-type]
    got = blend_totals(scores, rooms, *args[8:])  # type: ignore[arg-type]
    np.testing.assert_array_max_ulp(got[live], np.array([totals[p] for p in live]), maxulp=4)


@pytest.mark.parametrize("held", [False, True], ids=["function", "kernel-object"])
def test_a_near_tie_or_bad_input_leaves_the_choice_to_numpy(held: bool) -> None:
    if blend_choice is None:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        assert Kernel is None
        assert new_form() is blend_choice_numpy
        return
    choose = new_form() if held else blend_choice
    ones, zeros = np.ones(3), np.zeros(3)
    slots = np.arange(3, dtype=np.int64)
    args = (ones, zeros, slots, zeros, ones, ones)
    # Equal costs and equal room (an idle zone of one GPU type): an exact tie, the
    # kernel takes the first of the maxima as numpy would.
    assert choose(np.full(3, 5.0), *args[1:], None, 0.004, 1.0, 1.0, 0.0) == 0
    assert blend_choice_numpy(np.full(3, 5.0), *args[1:], None, 0.004, 1.0, 1.0, 0.0) == 0
    survivors = np.array([1, 2], dtype=np.int64)
    assert choose(np.full(3, 5.0), *args[1:], survivors, 0.004, 1.0, 1.0, 0.0) == 1
    # Equal room, costs a hair apart: the totals may differ in the last bit between
    # forms (exp of a tiny nonzero number), numpy decides.
    hair = np.array([5.0, 5.0 + 1e-11, 6.0])
    assert choose(hair, *args[1:], None, 0.004, 1.0, 1.0, 0.0) == -1
    costs = np.array([5.0, 4.0, 6.0])
    assert choose(costs, *args[1:], None, 0.004, 1.0, 1.0, 0.0) == 1
    survivors = np.array([0, 2], dtype=np.int64)
    assert choose(costs, *args[1:], survivors, 0.004, 1.0, 1.0, 0.0) == 0
    nan_costs = np.array([5.0, np.nan, 6.0])
    assert choose(nan_costs, *args[1:], None, 0.004, 1.0, 1.0, 0.0) == -1
    infinite = np.full(3, np.inf)
    assert choose(infinite, *args[1:], None, 0.004, 1.0, 1.0, 0.0) == -1
    with pytest.raises(TypeError, match="costs"):
        choose(np.ones((2, 2)), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="costs: a 1-D array of float64"):
        choose(np.ones(3, dtype=np.float32), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="costs: a 1-D array of float64"):
        choose(np.ones(3, dtype=np.int64), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="slots: a 1-D array of int64"):
        choose(costs, zeros, np.ones(3), zeros, ones, ones, None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="different lengths"):
        choose(np.ones(4), *args[1:], None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(IndexError, match="survivor"):
        choose(costs, *args[1:], np.array([7], dtype=np.int64), 0.004, 1.0, 1.0, 0.0)
    bad_slots = np.array([0, 1, 9], dtype=np.int64)
    with pytest.raises(IndexError, match="slot"):
        choose(costs, zeros, bad_slots, zeros, ones, ones, None, 0.004, 1.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="expected 11 arguments, got 1"):
        choose(costs)
    # The KV charges written in place between calls (a held buffer reads them afresh):
    # the cheapest GPU's room gone, the next one wins.
    kv, room_weight = np.zeros(3), 100.0
    assert choose(costs, kv, slots, zeros, ones, ones, None, 0.004, 1.0, room_weight, 0.0) == 1
    kv[1] = 1.0
    assert choose(costs, kv, slots, zeros, ones, ones, None, 0.004, 1.0, room_weight, 0.0) == 0


#: One kernel object for every example, as HELD.
FLOOR = new_floor_form()


@SETTINGS
@given(args=inputs(), nan_at=st.integers(-1, 89), value=st.sampled_from([math.nan, -math.inf]))
def test_the_kv_floor_is_the_free_blocks_lower_bound_in_every_form(
    args: Args, nan_at: int, value: float
) -> None:
    kv, slots, own_base, free_base = args[1], args[2], args[3], args[4]
    free_base = free_base.copy()  # type: ignore[attr-defined]
    if 0 <= nan_at < len(free_base):
        free_base[nan_at] = value
    expected = float(np.min(free_base - kv[slots]))  # type: ignore[index]
    for form in (kv_floor_numpy, FLOOR):
        got = form(kv, slots, free_base)  # type: ignore[arg-type]
        assert math.isnan(got) if math.isnan(expected) else got == expected
    # It bounds the free KV blocks from below (what was sent since is at most all of it).
    if not math.isnan(expected):
        assert expected <= free_blocks(kv[slots], own_base, free_base).min()  # type: ignore[index, arg-type]


def test_the_kv_floor_kernel_refuses_bad_input() -> None:
    if Kernel is None:  # an install without a compiler, asked for
        assert new_floor_form() is kv_floor_numpy
        return
    floor: Any = new_floor_form()  # called with bad arguments
    slots = np.arange(3, dtype=np.int64)
    assert floor(np.array([1.0, 2.0, 3.0]), slots, np.full(3, 10.0)) == 7.0
    with pytest.raises(IndexError, match="slot out of range"):
        floor(np.zeros(3), np.array([0, 1, 3], dtype=np.int64), np.zeros(3))
    with pytest.raises(ValueError, match="different lengths"):
        floor(np.zeros(3), slots, np.zeros(4))
    with pytest.raises(ValueError, match="no position"):
        floor(np.zeros(3), np.zeros(0, dtype=np.int64), np.zeros(0))
    with pytest.raises(TypeError, match="slots: a 1-D array of int64"):
        floor(np.zeros(3), np.zeros(3), np.zeros(3))
    with pytest.raises(TypeError, match="expected 3 arguments"):
        floor(np.zeros(3))

"""zone_agent.costs.ttft: its three forms give the same floats, to the bit.

The scalar reference (one GPU at a time), the numpy form and the C kernel — the module's
function and a kernel object holding the buffers of the arrays it was last given — are
called with the same arguments on random zones — a few GPUs holding part of the prompt
(a dict) or many (groups of mask bytes) — and must write identical arrays. The scalar form is
also held to :func:`gtm.routing.cost.predicted_ttft_ms`, the cost currency of every
tier, up to the rounding of its other order of operations.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtm import native
from gtm.routing.cost import predicted_ttft_ms
from gtm.testing.kernels import expected_state
from zone_agent.costs import ttft
from zone_agent.costs.ttft import (
    Kernel,
    cost_at,
    load_scale,
    new_form,
    ttft_costs,
    ttft_costs_numpy,
    ttft_costs_reference,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Args = tuple[object, ...]

#: One kernel object for every example: it holds one example's arrays into the next.
HELD = new_form()


@st.composite
def inputs(draw: st.DrawFn) -> Args:
    """The kernel's arguments (after ``out``) for a random model of a random zone."""
    n = draw(st.integers(1, 90))
    slot_count = n + draw(st.integers(0, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    slots = rng.permutation(slot_count)[:n].astype(np.int64)
    pending = rng.integers(0, 40_000, slot_count) * rng.integers(0, 2, slot_count)
    streams = rng.integers(0, 12, slot_count).astype(np.float64)
    external = rng.integers(0, 20, n) * 900.0 * rng.integers(0, 2, n)
    rate = rng.choice([0.0, 3_100.0, 8_000.0, 17_000.0, 31_000.5], n) * rng.choice([0.1, 1.0], n)
    ms_per_token = np.divide(1000.0, rate, out=np.full(n, np.inf), where=rate > 0)
    inv_max_batched = 1.0 / rng.choice([512.0, 2048.0, 8192.0], n)
    step_extra_ms = rng.random(n) * 30.0
    holders = rng.permutation(n)[: draw(st.integers(0, n))]
    depths = rng.integers(1, 40, len(holders))
    matches: ttft.Matches
    if draw(st.booleans()):
        matches = {int(p): int(d) for p, d in zip(holders, depths, strict=True)}
    else:
        masks: dict[int, int] = {}
        for p, d in zip(holders.tolist(), depths.tolist(), strict=True):
            masks[d] = masks.get(d, 0) | 1 << p
        matches = [(d, m.to_bytes((n + 7) // 8, "little")) for d, m in sorted(masks.items())]
    prompt = float(draw(st.integers(1, 60_000)))
    per_block = draw(st.sampled_from([16.0, 32.0, 512.0, 1234.0]))
    sequences = float(draw(st.integers(1, 3)))
    epsilon = draw(st.sampled_from([0.01, 0.25, 4.0]))
    scale = load_scale(epsilon, float(streams[slots].sum()), sequences, float(rate.sum()))
    decode = draw(st.booleans())
    return (
        pending.astype(np.float64), streams, slots, external, rate, ms_per_token,
        inv_max_batched, step_extra_ms, matches, prompt, per_block, sequences, scale, decode,
    )  # fmt: skip


def run(form: object, args: Args) -> np.ndarray:
    out = np.full(len(args[3]), np.nan)  # type: ignore[arg-type]
    form(out, *args)  # type: ignore[operator]
    return out


def test_the_kernel_is_built() -> None:
    # Without it decisions run the numpy form: CI must not pass on that quietly.
    expected = expected_state()
    assert native.kernel("zone_agent.costs._ttft").state is expected
    assert (ttft_costs is None) is (expected is native.KernelState.PYTHON)
    assert ttft.TTFT_COSTS is (ttft_costs if ttft_costs is not None else ttft_costs_numpy)


@SETTINGS
@given(args=inputs())
def test_every_form_gives_the_same_floats(args: Args) -> None:
    reference = run(ttft_costs_reference, args).tobytes()
    assert run(ttft_costs_numpy, args).tobytes() == reference
    if ttft_costs is not None:
        assert run(ttft_costs, args).tobytes() == reference
    assert run(HELD, args).tobytes() == reference
    assert run(HELD, args).tobytes() == reference  # every input array held


def test_a_kernel_object_reads_its_held_arrays_afresh_and_lets_go_of_replaced_ones() -> None:
    if Kernel is None:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        assert new_form() is ttft_costs_numpy
        return
    form = new_form()
    ones, slots = np.ones(3), np.arange(3, dtype=np.int64)
    pending = np.ones(3)
    args: Args = (pending, ones, slots, ones, ones, ones, ones, ones, {}, 100.0, 16.0, 1.0, 2.0)
    assert run(form, (*args, True)).tolist() == [204.0, 204.0, 204.0]
    pending[1] = 11.0  # written in place: the held buffer shows it
    assert run(form, (*args, True)).tolist() == [204.0, 224.0, 204.0]
    fresh = np.full(3, 3.0)  # another array: its own buffer, the old one let go
    assert run(form, (fresh, *args[1:], True)).tolist() == [208.0, 208.0, 208.0]
    pending.resize(4, refcheck=False)  # numpy refuses only while a buffer is held
    assert run(form, (fresh, *args[1:], False)).tolist() == [104.0, 104.0, 104.0]
    # A refused argument leaves the object working on good ones.
    with pytest.raises(TypeError, match="slots: a 1-D array of int64"):
        run(form, (fresh, ones, np.ones(3), *args[3:], True))
    assert run(form, (fresh, *args[1:], True)).tolist() == [208.0, 208.0, 208.0]


@settings(max_examples=300, deadline=None)
@given(
    queued=st.integers(0, 10**6),
    own=st.integers(0, 10**5),
    rate=st.floats(1.0, 1e6),
    inv_max_batched=st.sampled_from([1 / 512, 1 / 8192]),
    step_extra_ms=st.floats(0.0, 50.0),
)
def test_the_scalar_form_is_the_cost_currency_of_every_tier(
    queued: int, own: int, rate: float, inv_max_batched: float, step_extra_ms: float
) -> None:
    tokens = float(queued) + float(own)
    pressure = math.ceil(tokens * inv_max_batched) * step_extra_ms
    zone = cost_at(tokens, 1000.0 / rate, inv_max_batched, step_extra_ms, True)
    currency = predicted_ttft_ms(0.0, queued, own, rate, pressure)
    assert zone == pytest.approx(currency, rel=1e-13, abs=1e-9)


def test_credit_only_under_the_bounded_load_cap() -> None:
    ones, slots = np.ones(3), np.arange(3, dtype=np.int64)
    args: Args = (ones, ones, slots, ones, ones, ones, ones, ones, {0: 1, 2: 1}, 100.0, 16.0)
    # 1 stream + 1 ≤ ceil(2 × 1): credit; ≤ ceil(0.5 × 1) = 1: none.
    for form in (ttft_costs_reference, ttft_costs_numpy, ttft_costs):
        if form is None:
            continue
        assert run(form, (*args, 1.0, 2.0, True)).tolist() == [172.0, 204.0, 172.0]
        assert run(form, (*args, 1.0, 0.5, True)).tolist() == [204.0, 204.0, 204.0]


@pytest.mark.parametrize("held", [False, True], ids=["function", "kernel-object"])
def test_the_kernel_refuses_bad_input(held: bool) -> None:
    if ttft_costs is None:  # an install without a compiler, asked for
        assert os.environ.get("GTM_PURE_PYTHON")
        return
    ones, slots = np.ones(3), np.arange(3, dtype=np.int64)
    form = new_form() if held else ttft_costs

    def call(out: object = None, slots: object = slots, matches: object = None) -> None:
        form(
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
    with pytest.raises(ValueError, match="different lengths"):
        call(np.empty(4))
    with pytest.raises(TypeError, match="expected 15 arguments, got 2"):
        form(np.empty(3), ones)


@SETTINGS
@given(
    prompt=st.floats(0.0, 200_000.0),
    rows=st.lists(
        st.tuples(st.floats(1e-4, 10.0), st.floats(1e-5, 1.0), st.floats(0.0, 500.0)),
        min_size=1,
        max_size=8,
    ),
    decode=st.booleans(),
)
def test_the_prompt_alone_costs_what_the_formula_says_with_no_queue(
    prompt: float, rows: list[tuple[float, float, float]], decode: bool
) -> None:
    ms_per_token, inv_max_batched, step_extra_ms = (np.array(c) for c in zip(*rows, strict=True))
    alone = ttft.alone_costs_numpy(prompt, ms_per_token, inv_max_batched, step_extra_ms, decode)
    expected = [cost_at(prompt, m, i, s, decode) for m, i, s in rows]
    assert alone.tolist() == expected


@SETTINGS
@given(
    prompts=st.lists(st.floats(0.0, 200_000.0), min_size=1, max_size=8),
    decode=st.booleans(),
)
def test_a_prompt_per_gpu_costs_each_gpu_what_it_would_alone(
    prompts: list[float], decode: bool
) -> None:
    # The prompt's own part at each GPU (its uncached tokens there): an array of prompts.
    n = len(prompts)
    ms_per_token = np.linspace(0.05, 0.3, n)
    inv_max_batched = np.full(n, 1 / 2048)
    step_extra_ms = np.linspace(0.0, 30.0, n)
    columns = (ms_per_token, inv_max_batched, step_extra_ms)
    own = ttft.alone_costs_numpy(np.array(prompts), *columns, decode)
    expected = [
        ttft.alone_costs_numpy(p, ms_per_token[k : k + 1], inv_max_batched[k : k + 1],
                               step_extra_ms[k : k + 1], decode)[0]
        for k, p in enumerate(prompts)
    ]  # fmt: skip
    assert own.tolist() == expected

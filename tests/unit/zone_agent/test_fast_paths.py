"""The decision path's shortcuts give exactly what the plain formulation gives.

The zone's decision keeps prefix matches sparse (a dict of the few GPUs holding part of
the prompt), masks by gathering the survivors instead of ``np.where``, and walks the
prefix index with inline bit loops (see ``bench/zone_decision.py``). Each test here
computes the same thing the straightforward way — dense arrays, one GPU at a time, the
formulas of the module docstrings — on randomized zones, and demands equal results (not
approximately equal: the same float operations), so the two can never drift apart.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtm.gpu_profiles import LLAMA_8B
from gtm.routing.framework import Batch
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.routing.runner import Weighted
from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view, zone_profile
from zone_agent.accounting import Accounting
from zone_agent.batch import ZoneBatch
from zone_agent.costs.blend import new_floor_form
from zone_agent.costs.ttft import load_scale, ttft_costs_reference
from zone_agent.health import HealthStatus
from zone_agent.plugins._arrays import first_max, first_max_of
from zone_agent.plugins.fits_filter import FitsFilter
from zone_agent.plugins.health_filter import HealthFilter
from zone_agent.plugins.model_filter import ModelFilter
from zone_agent.plugins.ttft_scorer import Params, TtftScorer
from zone_agent.prefix import BYTES_FROM, PrefixIndex, iter_bits, set_bits
from zone_agent.profiles import DEFAULT_TTFT_SCALE_MS, builtin_profile
from zone_agent.router import ZoneProfile

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXTS = ("system prompt one " * 120, "system prompt two " * 90, "other " * 200)
TYPES = ("H100", "A100-80GB", "L40S", "V100")


@st.composite
def zones(draw: st.DrawFn) -> tuple[ZoneBatch, np.random.Generator]:
    """A zone with in-flight charges and prefix blocks, a request, and some removals."""
    count = draw(st.integers(1, 70))
    acc = Accounting()
    ramps = [draw(st.sampled_from([0.1, 0.5, 1.0])) for _ in range(count)]
    throttle = [draw(st.sampled_from([1.0, 1.0, 0.5])) for _ in range(count)]
    gpus = [
        Gpu(
            f"g{i:02d}",
            gpu_type=draw(st.sampled_from(TYPES)),
            health=HealthStatus(True, weight=ramps[i] * throttle[i], ramp=ramps[i]),
            running=draw(st.none() | st.floats(0, 300)),
            kv_usage=draw(st.floats(0, 1)),
        )
        for i in range(count)
    ]
    # Slots as a long-lived agent has them: sometimes a retired GPU's first (it still
    # holds prefix blocks), and in another order than the ids (positions ≠ slots).
    retired = draw(st.booleans())
    if retired:
        acc.slot("retired")
    for gpu in draw(st.permutations(gpus)) if draw(st.booleans()) else ():
        acc.slot(gpu.id)
    view = make_view(gpus, acc)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    holders = [f"g{i:02d}" for i in range(count)] + ["retired"] * retired
    for _ in range(draw(st.integers(0, 3 * count))):
        text = TEXTS[int(rng.integers(len(TEXTS)))][: int(rng.integers(256, 2200))]
        acc.start(
            holders[int(rng.integers(len(holders)))],
            prefill_tokens=float(rng.integers(0, 40_000)),
            sequences=int(rng.integers(1, 4)),
            kv_blocks=float(rng.integers(0, 2_000)),
            prefix_hashes=make_request(text=text).prefix_hashes,
            prefix_capacity=int(rng.choice([4, 40, 5_000])),
        )
    text = draw(st.sampled_from([*TEXTS, ""]))
    request = make_request(
        tokens=draw(st.integers(1, 30_000)),
        text=text or None,
        sequences=draw(st.integers(1, 3)),
        request_id=f"r{draw(st.integers(0, 99))}",
    )
    b = batch(view, request)
    if draw(st.booleans()):
        b.alive = rng.random(count) < 0.7
        b.all_alive = False
    return b, rng


def dense_matched(b: ZoneBatch) -> list[float]:
    """Leading blocks per candidate, looked up one GPU at a time."""
    hits = b.view.accounting.prefix.match(b.request.prefix_hashes)
    return [float(hits.get(int(slot), 0)) for slot in b.index.slots]


def reference_costs(b: ZoneBatch, *, decode: bool = True, epsilon: float = 0.25) -> list[float]:
    """ttft-scorer's costs by the formula's scalar reference, with the matches looked up
    one GPU at a time."""
    index, request, acc = b.index, b.request, b.view.accounting
    streams = acc.streams[index.slots]
    if b.all_alive:
        rate_sum, total = index.rate_sum, float(streams.sum())
    else:
        rate_sum, total = float(np.dot(index.rate, b.alive)), float(np.dot(streams, b.alive))
    matches = {p: int(m) for p, m in enumerate(dense_matched(b)) if m}
    out = np.empty(len(index.ids))
    ttft_costs_reference(
        out, acc.pending, acc.streams, index.slots, index.external_queued, index.rate,
        index.ms_per_token, index.inv_max_batched, index.step_extra_ms, matches,
        float(request.input_tokens), request.tokens_per_block, float(request.sequences),
        load_scale(epsilon, total, request.sequences, rate_sum), decode,
    )  # fmt: skip
    return [float(c) for c in out]


@SETTINGS
@given(zone=zones())
def test_sparse_matches_equal_the_dense_lookup(zone: tuple[ZoneBatch, np.random.Generator]) -> None:
    b, _ = zone
    dense = dense_matched(b)
    # Read by depth (groups of positions) before the dict exists, then as the dict.
    fresh = ZoneBatch(b.request, b.view, b.index)
    assert [fresh.blocks_at(p) for p in range(len(dense))] == dense
    assert fresh.any_match == any(dense)
    groups = fresh.match_groups
    if groups is not None:
        assert all(mask for _, mask in groups)
        assert [depth for depth, _ in groups] == sorted({int(d) for d in dense if d})
    assert b.matched.tolist() == dense
    assert b.any_match == any(dense)
    for position in range(len(dense)):
        assert b.uncached_at(position) == float(b.uncached[position])
        expected = (float(b.uncached[position]), int(dense[position]))
        assert b.prefill_at(position) == expected
        assert ZoneBatch(b.request, b.view, b.index).prefill_at(position) == expected


def test_a_new_batch_sets_every_slot_as_the_base_class_would() -> None:
    view = make_view([Gpu("g0"), Gpu("g1")], Accounting())
    request = make_request()
    index = view.by_model[request.model]
    b = ZoneBatch(request, view, index)
    slots = {slot for cls in ZoneBatch.__mro__ for slot in getattr(cls, "__slots__", ())}
    assert [slot for slot in sorted(slots) if not hasattr(b, slot)] == []
    base = Batch(index.ids, request, view, index.all_true)
    for slot in Batch.__slots__:
        assert getattr(b, slot) is getattr(base, slot), slot


@SETTINGS
@given(zone=zones(), decode=st.booleans())
def test_ttft_costs_equal_the_per_gpu_formula(
    zone: tuple[ZoneBatch, np.random.Generator], decode: bool
) -> None:
    """The scorer's inputs — sparse matches or groups of mask bytes, the survivors'
    streams from the running total — give the scalar reference's costs, bit for bit,
    with the C kernel and with the numpy form."""
    b, _ = zone
    expected = reference_costs(b, decode=decode)
    for kernel in (True, False):
        fresh = batch(b.view, b.request)
        fresh.alive = b.alive
        fresh.all_alive = b.all_alive
        if not b.all_alive:
            fresh.seal()
        scorer = TtftScorer(params=Params(decode_pressure=decode), kernel=kernel)
        assert scorer.costs_ms(fresh).tolist() == expected, kernel


@SETTINGS
@given(zone=zones())
def test_ttft_scores_mask_like_where(zone: tuple[ZoneBatch, np.random.Generator]) -> None:
    b, _ = zone
    scorer = TtftScorer()
    costs = scorer.costs_ms(b)
    live = np.where(b.alive, costs, np.inf)
    best = float(live.min()) if len(live) else math.inf
    scores = scorer.scores(b)
    if not best < math.inf:
        assert not scores.any()
        return
    for i in np.flatnonzero(b.alive):
        assert scores[i] == np.exp((best - costs[i]) * (1.0 / 250.0))
    assert ((scores >= 0.0) & (scores <= 1.0)).all()


@SETTINGS
@given(
    values=st.lists(
        st.sampled_from([0.0, 0.25, 0.5, 1.0, -np.inf, np.inf]) | st.floats(0, 1), min_size=1
    ),
    data=st.data(),
)
def test_first_max_of_survivors_equals_the_masked_argmax(
    values: list[float], data: st.DataObject
) -> None:
    totals = np.array(values)
    alive = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))))
    if not alive.any():
        alive[data.draw(st.integers(0, len(values) - 1))] = True
    survivors = alive.nonzero()[0]
    masked = first_max(totals, alive)
    gathered = first_max_of(totals, survivors)
    if np.isneginf(totals[alive]).all():
        assert alive[gathered]  # the gather never names a removed GPU
    else:
        assert gathered == masked
    assert first_max_of(totals, survivors, all_alive=True) == first_max(totals, alive, True)


def reference_match(index: PrefixIndex, hashes: tuple[int, ...]) -> dict[int, int]:
    """Leading blocks per slot, one slot at a time (the definition)."""
    out: dict[int, int] = {}
    slots = set(iter_bits(index.holders(hashes[0]))) if hashes else set()
    for slot in slots:
        depth = 0
        while depth < len(hashes) and index.holders(hashes[depth]) >> slot & 1:
            depth += 1
        out[slot] = depth
    return out


@SETTINGS
@given(
    inserts=st.lists(
        st.tuples(st.integers(0, 80), st.integers(0, 12), st.integers(1, 12)), max_size=40
    ),
    query=st.integers(0, 12),
)
def test_prefix_match_equals_the_per_slot_walk(
    inserts: list[tuple[int, int, int]], query: int
) -> None:
    chain = tuple(range(1000, 1012))
    index = PrefixIndex()
    for slot, start, length in inserts:
        index.insert(slot, chain[: min(12, start + length)], capacity=length + start)
    hashes = chain[:query]
    assert dict(index.match(hashes)) == reference_match(index, hashes)


@SETTINGS
@given(
    depths=st.lists(st.integers(1, 6), min_size=BYTES_FROM, max_size=900),
    query=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_prefix_match_of_a_prefix_hundreds_of_gpus_hold(
    depths: list[int], query: int, seed: int
) -> None:
    # A large zone: hundreds of GPUs got the system prompt, so hundreds leave the match
    # at one depth (their slots come from the mask's bytes, not one bit at a time).
    chain = tuple(range(2000, 2006))
    index = PrefixIndex()
    slots = np.random.default_rng(seed).permutation(len(depths) + 100)[: len(depths)]
    for slot, depth in zip(slots.tolist(), depths, strict=True):
        index.insert(slot, chain[:depth], capacity=10)
    hashes = chain[:query]
    got = index.match(hashes)
    assert dict(got) == reference_match(index, hashes)
    # Lowest slot first within a depth, as one bit at a time gives them.
    for depth in set(got.values()):
        at = [slot for slot, d in got.items() if d == depth]
        assert at == sorted(at)


@settings(max_examples=200, deadline=None)
@given(bits=st.sets(st.integers(0, 2_000), max_size=300))
def test_set_bits_reads_the_bits_of_a_mask_lowest_first(bits: set[int]) -> None:
    mask = sum(1 << b for b in bits)
    assert set_bits(mask) == list(iter_bits(mask)) == sorted(bits)


@SETTINGS
@given(zone=zones())
def test_a_decision_picks_the_cheapest_survivor(
    zone: tuple[ZoneBatch, np.random.Generator],
) -> None:
    """End to end: the TTFT-only profile chooses a survivor of least predicted TTFT."""
    b, _ = zone
    decision = builtin_profile("ttft-only").decide(b.request, b.view)
    survivors = batch(b.view, b.request)
    survivors.alive = decision.outcome.batch.alive
    survivors.all_alive = False
    costs = reference_costs(survivors)
    best = min(costs[i] for i in np.flatnonzero(decision.outcome.batch.alive))
    assert decision.outcome.batch.alive[decision.choice]
    assert math.isclose(costs[decision.choice], best, rel_tol=1e-9)
    assert decision.predicted_ttft_ms is not None
    assert math.isclose(decision.predicted_ttft_ms, costs[decision.choice], rel_tol=1e-9)
    assert decision.gpu.worker.models == (LLAMA_8B,)


@SETTINGS
@given(zone=zones())
def test_the_default_blends_ttft_and_kv_room(zone: tuple[ZoneBatch, np.random.Generator]) -> None:
    """End to end: the default profile chooses the first survivor of highest
    ``(exp(-(cost - best) / scale) + KV room) / 2``, worked out here one GPU at a time."""
    b, _ = zone
    decision = builtin_profile("default").decide(b.request, b.view)
    survivors = batch(b.view, b.request)
    survivors.alive = decision.outcome.batch.alive
    survivors.all_alive = False
    costs = reference_costs(survivors)
    alive = [int(i) for i in np.flatnonzero(decision.outcome.batch.alive)]
    best = min(costs[i] for i in alive)
    kv_free, kv_total = survivors.kv_free, survivors.index.kv_total
    scale = DEFAULT_TTFT_SCALE_MS
    totals = {
        i: (math.exp(-(costs[i] - best) / scale) + min(1.0, kv_free[i] / max(kv_total[i], 1.0)))
        / 2.0
        for i in alive
    }
    top = max(totals.values())
    assert decision.outcome.batch.alive[decision.choice]
    assert math.isclose(totals[decision.choice], top, rel_tol=1e-9, abs_tol=1e-12)
    assert decision.predicted_ttft_ms is not None
    assert math.isclose(decision.predicted_ttft_ms, costs[decision.choice], rel_tol=1e-9)


def test_a_removed_gpu_far_cheaper_than_the_survivors_does_not_overflow() -> None:
    """exp((best − cost)/scale) of a removed, much cheaper GPU used to overflow (a
    RuntimeWarning: an error in the tests, a PluginError for the request)."""
    acc = Accounting()
    view = make_view([Gpu("a", drained=True), Gpu("b")], acc)
    acc.start("b", prefill_tokens=1e9)
    decision = builtin_profile("default").decide(make_request(), view)
    assert decision.gpu_id == "b"
    assert all(0.0 <= s <= 1.0 for s in decision.outcome.scores[0][1])


# ------------------------------------------------------------ fused filters, cheapest pick


class FixedCosts(TtftScorer):
    """``ttft-cost`` with the costs given (to put two GPUs a hair apart)."""

    def __init__(self, costs: list[float]) -> None:
        super().__init__("ttft")
        self._fixed = costs

    def costs_ms(self, batch: ZoneBatch, /) -> np.ndarray:
        return np.array(self._fixed)


def fixed_profile(costs: list[float], *, fast: bool) -> ZoneProfile:
    scorer = FixedCosts(costs)
    return zone_profile(
        "t",
        [HealthFilter(), ModelFilter(), FitsFilter()],
        [Weighted(scorer, 1.0)],
        MaxScorePicker(),
        cost_model=scorer,
        fast_paths=fast,
    )


@pytest.mark.parametrize(
    ("costs", "choice", "worked_out"),
    [
        # One ulp above 10: exp(-1.8e-15 / 250) rounds to 1, the two tie and the picker
        # takes the first; one ulp above 100 (1.4e-14) already scores less than 1. Both
        # are within the margin, so the scores are worked out to pick.
        ([float(np.nextafter(10.0, 20.0)), 10.0, 300.0], 0, True),
        ([float(np.nextafter(100.0, 200.0)), 100.0, 300.0], 1, True),
        ([100.001, 100.0, 300.0], 1, False),
        # Exact ties score exp(0) = 1 each: the first, without the scores.
        ([300.0, 100.0, 100.0], 1, False),
        ([100.0, 100.0, float(np.nextafter(100.0, 200.0))], 0, True),
        # Nothing can serve (infinite costs): every score is 0, the first survivor wins.
        ([math.inf, math.inf, math.inf], 0, True),
    ],
)
def test_cheapest_pick_is_the_pickers_choice_even_on_near_ties(
    costs: list[float], choice: int, worked_out: bool
) -> None:
    view = make_view([Gpu(f"g{i}") for i in range(3)])
    fast = fixed_profile(costs, fast=True).decide(make_request(), view)
    reference = fixed_profile(costs, fast=False).decide(make_request(), view)
    assert fast.choice == reference.choice == choice
    assert (fast.outcome.scored is not None) is worked_out
    assert reference.outcome.scored is not None
    # Without them, the trace works the scores out when asked, and gets the same.
    assert fast.to_decision(None) == reference.to_decision(None)


def test_fused_filters_work_the_view_out_once_and_fall_back_when_they_must() -> None:
    acc = Accounting()
    gpus = [Gpu("a"), Gpu("b", health=HealthStatus(False, "ejected (outlier)")), Gpu("c")]
    view = make_view(gpus, acc)
    profile = builtin_profile("default")
    assert profile.runner.fast_paths == ("fused-filters", "blend-pick")
    first = profile.decide(make_request(), view)
    (memo,) = first.outcome.batch.prepared.values()  # the fused filters' prepare(view)
    assert list(memo) == [first.request.model]  # health + model survivors, cached
    assert first.outcome.batch.alive.tolist() == [True, False, True]
    again = profile.decide(make_request(request_id="req-2"), view)
    assert again.outcome.batch.alive is first.outcome.batch.alive
    # A half-open GPU depends on our in-flight streams: the filters run one by one.
    half = make_view([Gpu("a", health=HealthStatus(True, half_open=True)), Gpu("b")], acc)
    acc.start("a", prefill_tokens=10.0)
    decision = profile.decide(make_request(), half)
    assert decision.gpu_id == "b"
    (memo,) = decision.outcome.batch.prepared.values()
    assert list(memo.values()) == [None]


@pytest.mark.parametrize("kv_usage", [0.0, 1.0])
@pytest.mark.parametrize("gpus", [1, 2])
def test_a_lone_gpu_is_chosen_without_the_free_kv_rule_or_the_blend(
    kv_usage: float, gpus: int
) -> None:
    """A single-worker zone: the fused filters do not ask the free-KV rule (it removes
    a GPU only when another survivor has room, so never the last one) and the blend
    does not score; the choice, its prediction and its trace are the reference's, full
    cache or not. Two GPUs are asked as before."""
    acc = Accounting()
    zone = [Gpu(f"g{i}", running=4, kv_usage=kv_usage, kv_blocks=200) for i in range(gpus)]
    view = make_view(zone, acc)
    profile = builtin_profile("default")
    request = make_request(tokens=1000)
    fast = profile.decide(request, view)
    batch = fast.outcome.batch
    asked = new_floor_form in batch.index.memo  # the free-KV rule's cheap test ran
    assert asked is (gpus > 1)
    assert fast.outcome.scored is None
    reference = profile.without_fast_paths().decide(request, view)
    assert fast.choice == reference.choice == 0
    assert fast.predicted_ttft_ms == reference.predicted_ttft_ms
    assert fast.to_decision(None) == reference.to_decision(None)
    assert fast.outcome.steps == reference.outcome.steps
    if kv_usage == 1.0:  # the rule finds every GPU short, and keeps them all
        assert float(batch.kv_free.max()) < request.input_tokens / 16


def test_the_survivors_streams_come_from_the_running_total_or_a_gather() -> None:
    """The fused batch sums its survivors' streams from the accounting's running total
    minus the slots outside them; the same as summing the survivors, and a gather once
    the accounting has a slot the view did not know."""
    acc = Accounting()
    acc.slot("elsewhere")  # a GPU of another zone view: its streams never count
    gpus = [Gpu("a"), Gpu("b", health=HealthStatus(False, "ejected (outlier)")), Gpu("c")]
    view = make_view(gpus, acc)
    for gpu, sequences in (("a", 2), ("b", 3), ("c", 1), ("elsewhere", 5)):
        acc.start(gpu, prefill_tokens=0.0, sequences=sequences)
    profile = builtin_profile("default")

    def summed() -> float:
        decision = profile.decide(make_request(), view)
        assert decision.outcome.scored is None  # the fused filters and the blend decided
        return decision.outcome.batch.streams_sum()

    assert summed() == 3.0  # a and c
    acc.start("new-gpu", prefill_tokens=0.0, sequences=7)  # a slot the view never saw
    assert summed() == 3.0

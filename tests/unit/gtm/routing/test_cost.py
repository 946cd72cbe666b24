from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm.errors import RoutingError
from gtm.routing.cost import (
    RTT_INTERCEPT_MS,
    RTT_MS_PER_KM,
    CostInputError,
    bounded_load_capacity,
    cost_to_score,
    matching_prefix_blocks,
    predicted_ttft_ms,
    rtt_ms_from_distance,
    scores_from_costs,
    uncached_tokens,
    within_bounded_load,
)

# Vendored in the repository's data/ folder (test-only data, not shipped in the wheel).
RTT_CSV = Path(__file__).parents[4] / "data" / "latency" / "azure_inter_region_rtt.csv"


def _least_squares(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Closed-form ordinary least squares y = a + b·x (no numpy)."""
    n = len(points)
    mean_x = math.fsum(x for x, _ in points) / n
    mean_y = math.fsum(y for _, y in points) / n
    sxx = math.fsum((x - mean_x) ** 2 for x, _ in points)
    sxy = math.fsum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def test_rtt_model_constants_match_a_refit_of_the_azure_data() -> None:
    with RTT_CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    points = [(float(r["great_circle_km"]), float(r["rtt_ms"])) for r in rows]
    assert len(points) == 2350
    intercept, slope = _least_squares(points)
    assert intercept == pytest.approx(RTT_INTERCEPT_MS, abs=0.5)
    assert slope == pytest.approx(RTT_MS_PER_KM, abs=0.0001)
    residuals = [y - (intercept + slope * x) for x, y in points]
    assert statistics.pstdev(residuals) == pytest.approx(36.0, abs=1.0)


@pytest.mark.parametrize(
    ("km", "expected"), [(0.0, 26.0), (1000.0, 40.3), (5540.0, 26.0 + 0.0143 * 5540.0)]
)
def test_rtt_from_distance(km: float, expected: float) -> None:
    assert rtt_ms_from_distance(km) == pytest.approx(expected)


@pytest.mark.parametrize("km", [-1.0, math.nan, math.inf])
def test_rtt_from_distance_rejects_impossible_distances(km: float) -> None:
    with pytest.raises(CostInputError, match="distance_km"):
        rtt_ms_from_distance(km)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # rtt, queued, own, rate, decode → rtt + 1000·(queued + own)/rate + decode
        ((30.0, 0, 0, 10_000.0, 0.0), 30.0),
        ((30.0, 20_000, 2_000, 10_000.0, 0.0), 30.0 + 2_200.0),
        ((80.0, 0, 1_000, 20_000.0, 15.0), 80.0 + 50.0 + 15.0),
        ((0.0, 5, 5, 0.0, 0.0), math.inf),  # nothing serves there
    ],
)
def test_predicted_ttft(args: tuple[float, float, float, float, float], expected: float) -> None:
    assert predicted_ttft_ms(*args) == pytest.approx(expected)


def test_heterogeneous_gpus_weigh_for_free() -> None:
    # Same backlog on an H100 (≈2× an A100's prefill rate, ARCHITECTURE §2) drains in half.
    a100 = predicted_ttft_ms(0.0, 10_000, 0, 10_000.0)
    h100 = predicted_ttft_ms(0.0, 10_000, 0, 20_000.0)
    assert h100 == pytest.approx(a100 / 2)


@pytest.mark.parametrize(
    "bad",
    [
        {"rtt_ms": -1.0},
        {"rtt_ms": math.nan},
        {"queued_uncached_prefill_tokens": -1},
        {"own_uncached_prefill_tokens": -5},
        {"prefill_tokens_per_s": -1.0},
        {"decode_pressure_ms": -0.1},
    ],
)
def test_predicted_ttft_rejects_negative_inputs(bad: dict[str, float]) -> None:
    args: dict[str, float] = {
        "rtt_ms": 1.0,
        "queued_uncached_prefill_tokens": 0,
        "own_uncached_prefill_tokens": 0,
        "prefill_tokens_per_s": 1.0,
        "decode_pressure_ms": 0.0,
    }
    args.update(bad)
    with pytest.raises(CostInputError, match=next(iter(bad))):
        predicted_ttft_ms(**args)


def test_cost_input_error_is_a_routing_error_and_a_value_error() -> None:
    assert issubclass(CostInputError, RoutingError)
    assert issubclass(CostInputError, ValueError)


@pytest.mark.parametrize(
    ("hashes", "cached", "expected"),
    [
        ((), set(), 0),
        ((1, 2, 3), {1, 2, 3}, 3),
        ((1, 2, 3), {1, 2}, 2),
        ((1, 2, 3), {2, 3}, 0),  # chained: block 2 without block 1 is no hit
        ((1, 2, 3), {1, 3}, 1),
    ],
)
def test_matching_prefix_blocks_stops_at_first_miss(
    hashes: tuple[int, ...], cached: set[int], expected: int
) -> None:
    assert matching_prefix_blocks(hashes, cached) == expected


@pytest.mark.parametrize(
    ("input_tokens", "n_hashes", "cached_blocks", "block", "expected"),
    [
        (100, 0, 0, 16, 100),
        (100, 6, 6, 16, 4),  # 6 full blocks of 16; the 4-token tail is never cached
        (100, 6, 2, 16, 68),
        (100, 6, 9, 16, 4),  # more cached blocks than the prompt has: capped
        (1024, 2, 2, 512, 0),
        (0, 0, 0, 16, 0),
    ],
)
def test_uncached_tokens(
    input_tokens: int, n_hashes: int, cached_blocks: int, block: int, expected: int
) -> None:
    hashes = tuple(range(n_hashes))
    assert uncached_tokens(input_tokens, hashes, cached_blocks, block) == expected


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, (), 0, 16), "input_tokens"),
        ((1, (), -1, 16), "cached_prefix_blocks"),
        ((1, (), 0, 0), "block_tokens"),
    ],
)
def test_uncached_tokens_rejects_bad_inputs(
    args: tuple[int, tuple[int, ...], int, int], field: str
) -> None:
    with pytest.raises(CostInputError, match=field):
        uncached_tokens(*args)


@pytest.mark.parametrize(
    ("cost", "best", "scale", "expected"),
    [
        (100.0, 100.0, 50.0, 1.0),
        (150.0, 100.0, 50.0, math.exp(-1)),
        (300.0, 100.0, 100.0, math.exp(-2)),
        (90.0, 100.0, 50.0, 1.0),  # cheaper than "best": still 1
        (math.inf, 100.0, 50.0, 0.0),
        (math.nan, 100.0, 50.0, 0.0),
        # The same 100 ms excess scores the same on top of a 30 ms or a 300 ms best.
        (130.0, 30.0, 100.0, math.exp(-1)),
        (400.0, 300.0, 100.0, math.exp(-1)),
    ],
)
def test_cost_to_score(cost: float, best: float, scale: float, expected: float) -> None:
    assert cost_to_score(cost, best, scale) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("best", "scale"), [(0.0, 0.0), (0.0, -1.0), (0.0, math.inf), (math.inf, 1.0)]
)
def test_cost_to_score_rejects_bad_normalisation(best: float, scale: float) -> None:
    with pytest.raises(CostInputError):
        cost_to_score(1.0, best, scale)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    best=st.floats(min_value=0.0, max_value=1e6),
    a=st.floats(min_value=0.0, max_value=1e7),
    b=st.floats(min_value=0.0, max_value=1e7),
    scale=st.floats(min_value=1e-3, max_value=1e6),
)
def test_cost_to_score_is_in_unit_interval_and_monotone(
    best: float, a: float, b: float, scale: float
) -> None:
    low, high = sorted((a, b))
    s_low, s_high = cost_to_score(low, best, scale), cost_to_score(high, best, scale)
    assert 0.0 <= s_high <= s_low <= 1.0


def test_scores_from_costs() -> None:
    scores = scores_from_costs({"a": 100.0, "b": 200.0, "c": math.inf}, scale_ms=100.0)
    assert scores == pytest.approx({"a": 1.0, "b": math.exp(-1), "c": 0.0})
    assert scores_from_costs({"a": math.inf, "b": math.inf}, 10.0) == {"a": 0.0, "b": 0.0}
    assert scores_from_costs({}, 10.0) == {}


def test_scores_from_costs_agrees_with_cost_to_score() -> None:
    costs = {"a": 30.0, "b": 30.0, "c": 95.5, "d": 1e9, "e": math.inf, "f": math.nan, "g": 31.0}
    scores = scores_from_costs(costs, scale_ms=40.0)
    assert scores == {cid: cost_to_score(cost, 30.0, 40.0) for cid, cost in costs.items()}


@pytest.mark.parametrize(
    ("total", "bins", "eps", "expected"),
    [
        (10, 4, 0.25, 4),  # ⌈1.25·10/4⌉ = ⌈3.125⌉
        (8, 4, 0.5, 3),  # ⌈3.0⌉, exact
        (1, 100, 0.1, 1),  # one request over many bins still fits somewhere
        (0, 3, 0.25, 0),
        (1_000_000, 7, 0.01, math.ceil(1.01 * 1_000_000 / 7)),
    ],
)
def test_bounded_load_capacity(total: float, bins: int, eps: float, expected: int) -> None:
    assert bounded_load_capacity(total, bins, eps) == expected


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((10, 0, 0.25), "bins"),
        ((10, 4, 0.0), "epsilon"),
        ((-1, 4, 0.25), "total_load"),
        ((math.inf, 4, 0.2), "total_load"),
    ],
)
def test_bounded_load_capacity_rejects_bad_inputs(
    args: tuple[float, int, float], field: str
) -> None:
    with pytest.raises(CostInputError, match=field):
        bounded_load_capacity(*args)


@pytest.mark.parametrize(
    ("load", "incoming", "capacity", "fits"), [(3, 1, 4, True), (4, 1, 4, False), (0, 5, 4, False)]
)
def test_within_bounded_load(load: float, incoming: float, capacity: float, fits: bool) -> None:
    assert within_bounded_load(load, incoming, capacity) is fits

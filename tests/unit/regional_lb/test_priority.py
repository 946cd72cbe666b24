from __future__ import annotations

import math

import pytest

from regional_lb.priority import (
    OVERPROVISIONING_FACTOR,
    PANIC_THRESHOLD,
    CapacitySettings,
    DemandMeter,
    capacity_split,
    health,
    split,
    zone_headroom,
)


def test_envoy_defaults() -> None:
    assert OVERPROVISIONING_FACTOR == 1.4
    assert PANIC_THRESHOLD == 0.5


@pytest.mark.parametrize(
    ("local", "peers", "expected_local", "panic"),
    [
        ((10, 10), (10, 10), 1.0, False),  # healthy: everything stays
        ((3, 4), (10, 10), 1.0, False),  # 75 % x 1.4 > 100 %: still everything
        ((5, 7), (10, 10), 1.0, False),  # 71.4 % x 1.4 = 100 %: the edge
        ((1, 2), (10, 10), 0.7, False),  # 50 % x 1.4 = 70 % stays
        ((1, 4), (10, 10), 0.35, False),  # 25 %: 35 % stays, no panic (peers cover it)
        ((1, 4), (0, 0), 1.0, True),  # nowhere to go: all stays, in panic
        ((1, 4), (1, 4), 0.5, True),  # both at 35 %: normalised, local panics
        ((0, 4), (0, 4), 1.0, True),  # nothing healthy anywhere
        ((0, 0), (10, 10), 0.0, False),  # no local capacity at all
    ],
)
def test_split(
    local: tuple[int, int], peers: tuple[int, int], expected_local: float, panic: bool
) -> None:
    result = split(local, peers)
    assert result.local_load == pytest.approx(expected_local)
    assert result.local_load + result.spill_load == pytest.approx(1.0)
    assert result.local_panic is panic
    assert result.degraded is (result.spill_load > 0)


def test_health_is_clamped() -> None:
    assert health(5, 0) == 0.0
    assert health(7, 5) == 1.0
    assert health(-1, 5) == 0.0


@pytest.mark.parametrize(
    ("headroom", "demand", "expected_local"),
    [
        (8_000.0, 5_000.0, 1.0),  # the survivor can take it all: nothing spills
        (8_000.0, 8_000.0, 1.0),  # exactly enough
        (8_000.0, 10_000.0, 0.8),  # the excess, 2k of 10k, spills
        (4_000.0, 16_000.0, 0.25),
        (0.0, 100.0, 0.0),  # no headroom at all: everything is excess
        (8_000.0, 0.0, 1.0),  # no demand measured yet: stay home
        (0.0, 0.0, 1.0),
        (-5.0, 10.0, 0.0),  # clamped
    ],
)
def test_capacity_split_spills_exactly_the_excess(
    headroom: float, demand: float, expected_local: float
) -> None:
    result = capacity_split(headroom, demand, (1, 2), (10, 10))
    assert result.local_load == pytest.approx(expected_local)
    assert result.local_load + result.spill_load == pytest.approx(1.0)
    assert result.degraded is (expected_local < 1.0)
    assert result.demand_tokens_per_s == max(0.0, demand)
    assert result.headroom_tokens_per_s == max(0.0, headroom)
    assert result.local_health == 0.5  # health is still reported (and panic computed)
    assert not result.local_panic


@pytest.mark.parametrize(
    ("headroom", "demand", "peers", "expected_spill"),
    [
        (4_000.0, 10_000.0, 1e9, 0.6),  # peers take the whole excess
        (4_000.0, 10_000.0, 3_000.0, 0.3),  # only what the peers have room for
        (4_000.0, 10_000.0, 0.0, 0.0),  # every region short: nothing moves
        (0.0, 10_000.0, 2_500.0, 0.25),
        (12_000.0, 10_000.0, 0.0, 0.0),
    ],
)
def test_capacity_split_spills_no_more_than_the_peers_can_take(
    headroom: float, demand: float, peers: float, expected_spill: float
) -> None:
    result = capacity_split(headroom, demand, (2, 2), (4, 4), peer_headroom_tokens_per_s=peers)
    assert result.spill_load == pytest.approx(expected_spill)
    assert result.local_load == pytest.approx(1.0 - expected_spill)
    assert result.peer_headroom_tokens_per_s == peers


def test_capacity_split_keeps_envoys_panic_rule() -> None:
    # 1 of 4 GPUs healthy and no peer to take the rest: the zones ignore health.
    assert capacity_split(1_000.0, 500.0, (1, 4), (0, 0)).local_panic
    assert not capacity_split(1_000.0, 500.0, (1, 4), (10, 10)).local_panic


def test_envoy_split_measures_no_demand() -> None:
    result = split((1, 2), (10, 10))
    assert math.isnan(result.demand_tokens_per_s)
    assert math.isnan(result.headroom_tokens_per_s)
    assert math.isnan(result.peer_headroom_tokens_per_s)


@pytest.mark.parametrize(
    ("rate", "pending", "expected"),
    [
        (10_000.0, 0.0, 8_000.0),  # 80 % target utilisation
        (10_000.0, 4_000.0, 6_000.0),  # 4k pending over the 2 s horizon claim 2k/s
        (10_000.0, 16_000.0, 0.0),  # 1.6 s of queue: nothing left
        (10_000.0, 90_000.0, 0.0),  # never negative
        (0.0, 0.0, 0.0),  # a zone with no rate has no headroom
        (10_000.0, -5.0, 8_000.0),
    ],
)
def test_zone_headroom(rate: float, pending: float, expected: float) -> None:
    assert zone_headroom(rate, pending) == pytest.approx(expected)


def test_zone_headroom_settings() -> None:
    assert zone_headroom(10_000.0, 1_000.0, target_utilisation=1.0, backlog_horizon_s=1.0) == (
        pytest.approx(9_000.0)
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"target_utilisation": 0.0},
        {"target_utilisation": 1.5},
        {"backlog_horizon_s": 0.0},
        {"demand_decay_s": -1.0},
        {"demand_decay_s": math.inf},
    ],
)
def test_capacity_settings_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        CapacitySettings(**bad)


def test_demand_meter_converges_to_a_steady_rate() -> None:
    meter = DemandMeter(decay_s=10.0)
    now = 0.0
    for _ in range(600):  # 60 s of 10 requests/s of 500 tokens
        meter.add("m", 500, now)
        now += 0.1
    # Six time constants: within e^-6 = 0.25 % (plus the sawtooth of one request).
    assert meter.tokens_per_s("m", now) == pytest.approx(5_000.0, rel=0.01)
    assert meter.requests_per_s("m", now) == pytest.approx(10.0, rel=0.01)
    assert meter.tokens_per_s("other", now) == 0.0


def test_demand_meter_decays_when_admissions_stop() -> None:
    meter = DemandMeter(decay_s=10.0)
    meter.add("m", 1_000, 0.0)
    assert meter.tokens_per_s("m", 0.0) == pytest.approx(100.0)
    assert meter.tokens_per_s("m", 10.0) == pytest.approx(100.0 / math.e)
    assert meter.tokens_per_s("m", 5.0) == pytest.approx(100.0 * math.exp(-0.5))
    # A clock read out of order decays nothing (never grows either).
    assert meter.tokens_per_s("m", -3.0) == pytest.approx(100.0)


def test_demand_meter_stays_bounded() -> None:
    meter = DemandMeter(max_models=3)
    for i in range(5):
        meter.add(f"m{i}", 10, float(i))
    assert meter.models() == ("m2", "m3", "m4")  # the least recently admitted went


@pytest.mark.parametrize(
    ("decay", "models", "field"),
    [(0.0, 1, "decay_s"), (math.nan, 1, "decay_s"), (1.0, 0, "max_models")],
)
def test_demand_meter_settings_are_checked(decay: float, models: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DemandMeter(decay, max_models=models)

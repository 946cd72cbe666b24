from __future__ import annotations

import pytest

from fleetsim.baselines import Placement, RegionPolicy
from fleetsim.baselines.gorgo import GORGO_TP_MS, Gorgo, region_cost_ms
from tests.unit.fleetsim.baselines.fakes import FakeLoad, FakeRegions, allowing, request


def test_the_cost_is_queued_plus_half_running_plus_unmatched_per_gpu() -> None:
    regions = FakeRegions()
    regions.loads["eu"] = FakeLoad(gpus=2, pending=400.0, running_tokens=800.0, matched=10)
    # 1,000 prompt tokens, 10 blocks of 16 cached: 840 unmatched.
    expected = GORGO_TP_MS * (400.0 / 2 + 0.5 * 800.0 / 2 + 840.0)
    assert region_cost_ms(request(1_000, blocks=10), "eu", regions) == pytest.approx(expected)


def test_an_idle_home_keeps_the_request() -> None:
    rule: RegionPolicy = Gorgo()
    assert rule.choose(request(), allowing("eu", "us"), FakeRegions()) == Placement(
        "eu", "eu", 10.0
    )


def test_forwards_when_the_round_trip_plus_the_peer_beats_home() -> None:
    regions = FakeRegions(between_ms=50.0)
    # Home has 4,000 queued prefill tokens per GPU: 376 ms against 50 ms + the peer's.
    regions.loads["eu"].pending = 16_000.0
    placed = Gorgo().choose(request(), allowing("eu", "us", "ap"), regions)
    # Both peers cost the same; the first in fleet order wins, the round trip added.
    assert placed == Placement("eu", "us", 10.0 + 50.0)


def test_a_peer_the_residency_forbids_is_never_chosen() -> None:
    regions = FakeRegions()
    regions.loads["eu"].pending = 16_000.0
    placed = Gorgo().choose(request(), allowing("eu", "ap"), regions)
    assert placed == Placement("eu", "ap", 10.0 + 50.0)
    assert Gorgo().choose(request(), allowing("eu"), regions) == Placement("eu", "eu", 10.0)


def test_a_long_round_trip_keeps_it_home() -> None:
    regions = FakeRegions(between_ms=1_000.0)
    regions.loads["eu"].pending = 16_000.0
    placed = Gorgo().choose(request(), allowing("eu", "us"), regions)
    assert placed == Placement("eu", "eu", 10.0)
    assert not Gorgo.arrival_only

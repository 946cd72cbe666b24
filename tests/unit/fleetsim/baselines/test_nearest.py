from __future__ import annotations

from fleetsim.baselines import Placement, RegionPolicy
from fleetsim.baselines.nearest import NearestAllowed
from tests.unit.fleetsim.baselines.fakes import FakeRegions, allowing, request


def test_the_nearest_region_the_residency_allows_with_the_client_round_trip() -> None:
    rule: RegionPolicy = NearestAllowed()
    regions = FakeRegions()
    assert rule.choose(request(), allowing("eu", "us", "ap"), regions) == Placement(
        "eu", "eu", 10.0
    )
    assert rule.choose(request(), allowing("us", "ap"), regions) == Placement("us", "us", 80.0)


def test_no_allowed_region_is_a_refusal() -> None:
    assert NearestAllowed().choose(request(), allowing(), FakeRegions()) is None


def test_load_never_moves_it() -> None:
    regions = FakeRegions()
    regions.loads["eu"].prefilling = 1_000.0
    placed = NearestAllowed().choose(request(), allowing("eu", "us"), regions)
    assert placed == Placement("eu", "eu", 10.0)
    assert NearestAllowed.arrival_only

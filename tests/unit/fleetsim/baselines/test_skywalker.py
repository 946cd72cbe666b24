from __future__ import annotations

from fleetsim.baselines import Placement, RegionPolicy
from fleetsim.baselines.skywalker import SKYWALKER_PEER_MAX, SKYWALKER_PUSH_AT, SkyWalker
from tests.unit.fleetsim.baselines.fakes import FakeRegions, allowing, request


def test_below_the_push_threshold_it_stays_home() -> None:
    rule: RegionPolicy = SkyWalker()
    regions = FakeRegions()
    regions.loads["eu"].prefilling = (SKYWALKER_PUSH_AT - 0.5) * regions.loads["eu"].gpus
    assert rule.choose(request(), allowing("eu", "us"), regions) == Placement("eu", "eu", 10.0)


def test_pushes_to_the_least_loaded_allowed_peer() -> None:
    regions = FakeRegions(between_ms=40.0)
    regions.loads["eu"].prefilling = SKYWALKER_PUSH_AT * 4
    regions.loads["us"].prefilling = 1.0
    placed = SkyWalker().choose(request(), allowing("eu", "us", "ap"), regions)
    assert placed == Placement("eu", "ap", 10.0 + 40.0)
    # The idler peer is not allowed: the other one, still under the peer ceiling.
    placed = SkyWalker().choose(request(), allowing("eu", "us"), regions)
    assert placed == Placement("eu", "us", 10.0 + 40.0)


def test_no_push_when_every_peer_is_busy_too() -> None:
    regions = FakeRegions()
    for load in regions.loads.values():
        load.prefilling = (SKYWALKER_PEER_MAX + 1.0) * load.gpus
    regions.loads["eu"].prefilling = SKYWALKER_PUSH_AT * 10
    placed = SkyWalker().choose(request(), allowing("eu", "us", "ap"), regions)
    assert placed == Placement("eu", "eu", 10.0)
    assert not SkyWalker.arrival_only

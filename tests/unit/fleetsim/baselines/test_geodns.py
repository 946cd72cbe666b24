from __future__ import annotations

from fleetsim.baselines import Placement, RegionPolicy
from fleetsim.baselines.geodns import GeoDns
from tests.unit.fleetsim.baselines.fakes import FakeRegions, allowing, request


def test_the_nearest_region_whatever_the_residency() -> None:
    rule: RegionPolicy = GeoDns()
    regions = FakeRegions()
    assert rule.choose(request(), allowing("us"), regions) == Placement("eu", "eu", 10.0)
    # Residency-blind: even a tenant allowed nowhere is sent (a violation, not a refusal).
    assert rule.choose(request(), allowing(), regions) == Placement("eu", "eu", 10.0)
    assert GeoDns.arrival_only

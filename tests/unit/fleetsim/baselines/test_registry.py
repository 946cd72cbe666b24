"""Every baseline policy's region mode selects a rule, and the simulator runs it
through the protocol alone."""

from __future__ import annotations

import pytest

from fleetsim.baselines import REGION_POLICIES, region_policy
from fleetsim.policies import POLICIES, RegionMode
from fleetsim.routing import Baseline
from fleetsim.simulator import routing_for
from fleetsim.tiers import Tiers
from gtm.errors import ConfigError


def test_every_mode_but_gtm_has_a_rule() -> None:
    assert set(REGION_POLICIES) == set(RegionMode) - {RegionMode.GTM}
    with pytest.raises(ConfigError):
        region_policy(RegionMode.GTM)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_policy_spec_selects_its_routing(name: str) -> None:
    spec = POLICIES[name]
    routing = routing_for(spec)
    if spec.region_mode is RegionMode.GTM:
        assert isinstance(routing, Tiers)
        return
    assert isinstance(routing, Baseline)
    assert type(routing.rule) is REGION_POLICIES[spec.region_mode]
    # Only a rule that never reads a region's live state lets a run split its regions.
    assert routing.partitionable is type(routing.rule).arrival_only

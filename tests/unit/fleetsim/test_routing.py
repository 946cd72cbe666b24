"""The loop asks the policy's routing, never the policy: how each kind pools the GPUs,
what it charges, and what it refuses to do."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.events import Hop
from fleetsim.fleet import scaled_fleet
from fleetsim.policies import POLICIES
from fleetsim.routing import Baseline
from fleetsim.simulator import Simulator, Status
from fleetsim.tiers import Tiers
from gtm.errors import SimulationError
from gtm.gpu_profiles import LLAMA_8B
from tests.unit.fleetsim.test_simulator import active, workload


def simulator(name: str) -> Simulator:
    fleet = scaled_fleet(active(), 12)
    return Simulator(fleet, active(), POLICIES[name], workload(fleet), model=LLAMA_8B)


def test_a_baseline_pools_each_region_whole_with_no_regional_tier() -> None:
    sim = simulator("least-connections")
    assert isinstance(sim.routing, Baseline)
    assert sorted(p.region for p in sim.pools.values()) == sorted(sim.region_ids)
    assert all(p.regional is None for p in sim.pools.values())
    result = sim.run()
    assert np.all(result.outcomes.ends == 1)
    assert not sim.routing.waiting()


def test_gtm_pools_per_zone_and_charges_each_region_s_accounting() -> None:
    sim = simulator("gtm")
    tiers = sim.routing
    assert isinstance(tiers, Tiers)
    zones = [z.id for r in sim.fleet.regions for z in r.zones]
    assert list(sim.pools) == zones
    for pool in sim.pools.values():
        assert pool.regional is tiers.zacc[pool.region]
    result = sim.run()
    assert np.all(result.outcomes.ends == 1)
    assert int(np.sum(result.outcomes.status == Status.OK)) > 0


def test_a_baseline_has_no_global_tier_and_never_spills() -> None:
    routing = simulator("round-robin").routing
    assert not routing.GLOBAL_TIER
    with pytest.raises(SimulationError):
        routing.on_hop(Hop(0.0, 0, "eu-west", 1, ("eu-central",), 0.0, 0.0))
    with pytest.raises(SimulationError):
        routing.decide_until(1.0, True, 2, {})


@pytest.mark.parametrize(
    ("name", "partitionable"), [("gorgo", False), ("geodns-least-connections", True)]
)
def test_only_rules_that_read_no_live_state_split_a_run(name: str, partitionable: bool) -> None:
    assert simulator(name).routing.partitionable is partitionable

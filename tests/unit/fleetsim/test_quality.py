"""What makes the routing comparison fair and gtm's global choice informed: every policy
meets the same tenant quotas, and gtm's global tier charges its in-flight ledger."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from fleetsim.fleet import scaled_fleet
from fleetsim.metrics import Summary
from fleetsim.policies import POLICIES, RegionMode, policy
from fleetsim.report import targets
from fleetsim.simulator import Simulator, Status
from global_lb.inflight import LedgerSettings
from gtm.gpu_profiles import LLAMA_8B
from tests.unit.fleetsim.test_simulator import active, overload


@pytest.mark.parametrize("name", ["gtm", "least-connections", "gorgo", "geodns-least-connections"])
def test_every_policy_meets_the_same_quotas(name: str) -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = overload(rate=40.0)

    def quota_refusals(scale: float) -> int:
        sim = Simulator(fleet, active(), POLICIES[name], reqs, model=LLAMA_8B, quota_scale=scale)
        result = sim.run()
        assert np.all(result.outcomes.ends == 1)
        # Every ticket was finished or refunded: nothing stays held.
        assert not sim.quota_tickets
        return sum(1 for r in result.outcomes.reason if r.startswith("quota:"))

    assert quota_refusals(0.05) > 0
    assert quota_refusals(1000.0) == 0


def _spills(ledger: LedgerSettings) -> int:
    """Requests gtm's regional tier had to pass on to a peer region because the global
    tier sent more than the region could take, with summaries published once (t = 0)."""
    fleet = scaled_fleet(active(), 12)
    reqs = overload(rate=20.0, duration=3.0)
    sim = Simulator(
        fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B, duration_s=3.0, drain_s=5.0,
        tick_s=100.0, ledger=ledger,
    )  # fmt: skip
    result = sim.run()
    assert np.all(result.outcomes.ends == 1)
    assert (result.outcomes.status == Status.OK).sum() > 30
    return result.spills


def test_the_global_ledger_stops_one_summary_from_herding() -> None:
    # A ledger that forgets at once: every decision reads the one summary, all of a
    # city's requests go to the region that looked best in it, and its regional LB must
    # spill what it cannot take (59 with this seed).
    blind = _spills(LedgerSettings(expire_s=1e-9))
    # Charges that last: once that region has had its share, the global tier sends the
    # rest to the next best itself (22).
    charged = _spills(LedgerSettings(expire_s=100.0))
    assert charged * 2 < blind


def _row(name: str, p99: float, goodput: float) -> Summary:
    values: dict[str, Any] = {f.name: 0.0 for f in dataclasses.fields(Summary)}
    values.update(policy=name, ttft_p99=p99, goodput_rps=goodput, violations=0, sim_rps=1.0)
    return Summary(**values)


def test_the_ablation_runs_gtm_without_its_ledger_and_is_never_the_best_baseline() -> None:
    ablation = policy("gtm-no-ledger")
    assert ablation.region_mode is RegionMode.GTM
    assert ablation.ledger is not None
    assert not ablation.ledger.enabled
    assert "gtm-no-ledger" not in POLICIES  # not in the default set
    lines = targets(
        [
            _row("gtm", 3.0, 60.0),
            _row("gtm-no-ledger", 1.0, 50.0),
            _row("llm-d-blend", 4.0, 55.0),
            _row("least-connections", 9.0, 49.0),
        ]
    )
    best = next(line for line in lines if "best baseline" in line)
    assert best.startswith("- met")
    assert "llm-d-blend, 4.00 s" in best
    goodput = next(line for line in lines if "least connections" in line)
    assert goodput.startswith("- met")

"""The zone agents' flow control in the simulator (``gtm-admission``): every request
ends exactly once (those held at the horizon too), runs repeat exactly, and under a
burst the zones hold requests back and serve more of them within the SLO than gtm
sending every request at once."""

from __future__ import annotations

import numpy as np

from fleetsim.fleet import scaled_fleet
from fleetsim.metrics import summarise
from fleetsim.policies import ABLATIONS, POLICIES, policy
from fleetsim.simulator import Simulator, Status
from gtm.gpu_profiles import LLAMA_8B
from tests.unit.fleetsim.test_simulator import active, overload, workload


def test_gtm_admission_is_an_ablation_of_gtm_with_flow_control_on() -> None:
    spec = policy("gtm-admission")
    assert spec is ABLATIONS["gtm-admission"]
    assert spec.admission is not None
    assert spec.zone_profile == POLICIES["gtm"].zone_profile
    assert POLICIES["gtm"].admission is None


def test_every_request_ends_once_and_runs_repeat_exactly() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    runs = [
        Simulator(fleet, active(), policy("gtm-admission"), reqs, model=LLAMA_8B, scrape_s=0.25)
        .run()
        .outcomes
        for _ in range(2)
    ]
    o = runs[0]
    assert np.all(o.ends == 1)
    assert not np.any(o.status == Status.PENDING)
    assert np.array_equal(o.status, runs[1].status)
    assert np.array_equal(o.ttft_s, runs[1].ttft_s, equal_nan=True)
    assert np.array_equal(o.gpu, runs[1].gpu)


def test_under_overload_held_requests_end_and_goodput_rises() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = overload()
    results = {
        name: Simulator(
            fleet, active(), policy(name), reqs, model=LLAMA_8B, duration_s=20.0,
            drain_s=10.0, client_timeout_s=30.0, scrape_s=0.25,
        ).run()
        for name in ("gtm", "gtm-admission")
    }  # fmt: skip
    held = results["gtm-admission"].outcomes
    assert np.all(held.ends == 1)
    assert not np.any(held.status == Status.PENDING)
    goodput = {name: summarise(r, reqs).goodput_rps for name, r in results.items()}
    assert goodput["gtm-admission"] > goodput["gtm"], goodput

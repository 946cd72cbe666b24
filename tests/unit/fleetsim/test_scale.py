"""The simulator's speed-ups change nothing: the regional fast path (no trace record per
request) ends every request exactly as the reference profile does, on a fleet loaded
enough to spill and queue."""

from __future__ import annotations

import numpy as np

from fleetsim.fleet import scaled_fleet
from fleetsim.policies import POLICIES
from fleetsim.simulator import RunResult, Simulator
from gtm.gpu_profiles import LLAMA_8B

from .test_simulator import active, workload

FIELDS = ("status", "ttft_s", "e2e_s", "region", "home", "cached", "violation", "ends")


def _run(*, fast: bool, rate: float) -> RunResult:
    fleet = scaled_fleet(active(), 12)
    requests = workload(fleet, rate=rate)
    return Simulator(
        fleet, active(), POLICIES["gtm"], requests, model=LLAMA_8B, regional_fast_path=fast
    ).run()


def test_the_regional_fast_path_ends_every_request_like_the_reference() -> None:
    for rate in (20.0, 80.0):
        fast, slow = _run(fast=True, rate=rate), _run(fast=False, rate=rate)
        for name in FIELDS:
            assert np.array_equal(
                getattr(fast.outcomes, name), getattr(slow.outcomes, name), equal_nan=True
            ), name
        assert fast.outcomes.reason == slow.outcomes.reason
        assert fast.spills == slow.spills
        assert np.array_equal(fast.gpu_busy_s, slow.gpu_busy_s)
    # The overloaded run exercised more than local choices: spills and the fair queue.
    assert slow.spills > 0
    assert "regional queue ttl" in set(slow.outcomes.reason)

"""One simulation over several processes (fleetsim.partition) ends every request
exactly as the same simulation in one process does."""

from __future__ import annotations

import ctypes
import math
from functools import cache
from multiprocessing import Pipe

import numpy as np
import pytest

from fleetsim import partition
from fleetsim.fleet import FleetSpec, scaled_fleet
from fleetsim.geography import Geography, Place
from fleetsim.partition import plan_partition
from fleetsim.policies import POLICIES
from fleetsim.simulator import FaultPlan, Hop, RunResult, Simulator, Status
from fleetsim.workload import SimRequest, build_requests
from gtm.errors import SimulationError
from gtm.gpu_profiles import LLAMA_8B
from gtm.models import GeoPoint
from gtm.policy_store import ActivePolicy, activate
from policies import load_examples
from tests.unit.fleetsim.test_simulator import synthetic_trace

#: Clients on four continents, so that every region of the example fleet gets work.
PLACES = (
    Place("New York", "US", "NA", GeoPoint(lat=40.7, lon=-74.0), 8_000_000, -5.0),
    Place("Los Angeles", "US", "NA", GeoPoint(lat=34.05, lon=-118.24), 4_000_000, -8.0),
    Place("Berlin", "DE", "EU", GeoPoint(lat=52.5, lon=13.4), 3_600_000, 1.0),
    Place("Dublin", "IE", "EU", GeoPoint(lat=53.35, lon=-6.26), 1_200_000, 0.0),
    Place("Tokyo", "JP", "AS", GeoPoint(lat=35.7, lon=139.7), 9_000_000, 9.0),
    Place("Singapore", "SG", "AS", GeoPoint(lat=1.35, lon=103.8), 5_600_000, 8.0),
)

OUTCOMES = ("status", "ttft_s", "e2e_s", "region", "gpu", "home", "cached", "violation", "ends")


@cache
def active() -> ActivePolicy:
    return activate(1, load_examples())


@cache
def fleet() -> FleetSpec:
    return scaled_fleet(active(), 24)


@cache
def busy_workload() -> tuple[SimRequest, ...]:
    # Well past the 24 GPUs' capacity: regions queue, spill and refuse.
    return tuple(
        build_requests(synthetic_trace(1500), Geography(PLACES), rate_rps=45.0, duration_s=25.0)
    )


def run(policy: str, workers: int, **kwargs: object) -> RunResult:
    sim = Simulator(
        fleet(), active(), POLICIES[policy], busy_workload(), model=LLAMA_8B,
        duration_s=25.0, drain_s=20.0, workers=workers, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    return sim.run()


def assert_same(one: RunResult, many: RunResult) -> None:
    a, b = one.outcomes, many.outcomes
    for name in OUTCOMES:
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert a.reason == b.reason
    assert one.spills == many.spills
    assert one.sim_s == many.sim_s
    assert np.array_equal(one.gpu_busy_s, many.gpu_busy_s)
    assert np.array_equal(one.gpu_busy_window_s, many.gpu_busy_window_s)
    assert one.util_timeline == many.util_timeline
    assert one.max_kv_fraction == many.max_kv_fraction
    assert one.prefix_hit_tokens == many.prefix_hit_tokens
    assert one.prefix_queried_tokens == many.prefix_queried_tokens


def test_gtm_over_two_workers_ends_every_request_as_one_process() -> None:
    # Tight quotas too: a region's quota refusal must not change the global tier's
    # choices in another worker.
    one, two = run("gtm", 1, quota_scale=1.5), run("gtm", 2, quota_scale=1.5)
    assert one.workers == 1
    assert two.workers == 2
    assert len(two.worker_waited_s) == 2
    # The run exercises what couples the workers: spills between regions, refusals,
    # queueing, the global tier's choices everywhere.
    assert one.spills > 0
    assert np.any(one.outcomes.status == Status.REFUSED)
    assert np.any(one.outcomes.status == Status.TIMED_OUT)
    assert len(set(one.outcomes.region.tolist()) - {-1}) == 6
    assert np.all(two.outcomes.ends == 1)
    assert_same(one, two)


def test_three_workers_too() -> None:
    assert_same(run("gtm", 1), run("gtm", 3))


@pytest.mark.parametrize("policy", ["least-connections", "geodns-least-connections"])
def test_baselines_over_two_workers(policy: str) -> None:
    one, two = run(policy, 1), run(policy, 2)
    assert two.workers == 2
    assert_same(one, two)


def test_faults_land_on_the_same_gpus_in_every_worker() -> None:
    faults = FaultPlan(crash_fraction=0.1, crash_at_s=8.0, slow_fraction=0.2, slowdown=3.0)
    one, two = run("gtm", 1, faults=faults), run("gtm", 2, faults=faults)
    assert np.any(one.outcomes.status == Status.FAILED)
    assert_same(one, two)


def test_zone_agents_scraping_their_gpus_too() -> None:
    one, two = run("gtm", 1, scrape_s=0.25), run("gtm", 2, scrape_s=0.25)
    assert not np.array_equal(one.outcomes.gpu, run("gtm", 1).outcomes.gpu)
    assert_same(one, two)


@pytest.mark.parametrize("policy", ["gorgo", "skywalker"])
def test_policies_reading_peers_live_state_stay_in_one_process(policy: str) -> None:
    result = run(policy, 2)
    assert result.workers == 1


def test_no_network_no_lookahead_one_process() -> None:
    sim = Simulator(
        fleet(), active(), POLICIES["gtm"], busy_workload()[:50], model=LLAMA_8B, network=False
    )
    assert plan_partition(sim, 2) is None
    assert plan_partition(Simulator(
        fleet(), active(), POLICIES["gtm"], busy_workload()[:50], model=LLAMA_8B
    ), 1) is None  # fmt: skip


def test_plan_keeps_close_regions_together_and_the_lookahead_is_the_shortest_hop() -> None:
    sim = Simulator(fleet(), active(), POLICIES["gtm"], busy_workload(), model=LLAMA_8B)
    plan = plan_partition(sim, 2)
    assert plan is not None
    assert sorted(r for g in plan.groups for r in g) == sorted(sim.region_ids)
    assert all(plan.groups)
    # eu-west and eu-central are 26 ms apart: splitting them would give a 13 ms lookahead.
    assert plan.worker["eu-west"] == plan.worker["eu-central"]
    shortest = min(
        sim.rtt.between(a, b) / 2.0 / 1000.0
        for a in sim.region_ids
        for b in sim.region_ids
        if plan.worker[a] != plan.worker[b]
    )
    # A hair under it: a spill's landing time and a worker's bound are sums rounded
    # apart, and the hair keeps the spill in the receiver's future.
    assert plan.lookahead_s == shortest - partition.LOOKAHEAD_MARGIN_S
    assert plan.lookahead_s >= partition.SHORT_LOOKAHEAD_S
    # Baselines never move a request between regions: no lookahead needed.
    base = Simulator(fleet(), active(), POLICIES["round-robin"], busy_workload(), model=LLAMA_8B)
    base_plan = plan_partition(base, 2)
    assert base_plan is not None
    assert math.isinf(base_plan.lookahead_s)


def test_a_failing_worker_fails_the_run_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = Simulator.tick
    # A region of worker 0 (this process): the others are forked workers.
    probe = Simulator(
        fleet(), active(), POLICIES["gtm"], busy_workload(), model=LLAMA_8B, duration_s=25.0
    )
    plan = plan_partition(probe, 2)
    assert plan is not None
    mine = next(region for region, worker in plan.worker.items() if worker == 0)

    def tick(self: Simulator, now: float) -> None:
        if mine not in self.owned and now >= 3.0:
            raise RuntimeError("boom in a worker")
        real(self, now)

    monkeypatch.setattr(Simulator, "tick", tick)
    with pytest.raises(SimulationError, match="boom in a worker"):
        run("gtm", 2)


def test_a_spill_inside_the_window_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lookahead longer than the real hops: the first spill across workers lands in a
    # worker's past, which the exchange refuses rather than simulate out of order.
    real = partition.plan_partition

    def too_long(sim: Simulator, workers: int) -> partition.Plan | None:
        plan = real(sim, workers)
        assert plan is not None
        return partition.Plan(plan.groups, 10.0, plan.worker)

    monkeypatch.setattr(partition, "plan_partition", too_long)
    with pytest.raises(SimulationError, match="lookahead"):
        run("gtm", 2)


def test_the_probe_simulates_a_short_prefix_of_the_run() -> None:
    sim = Simulator(
        fleet(), active(), POLICIES["gtm"], busy_workload(), model=LLAMA_8B, duration_s=25.0
    )
    # 5 % of the 25 s window, but at least a second.
    assert partition.probe_seconds(sim) == 1.25
    assert len(busy_workload()) < partition.PROBE_ARRIVALS
    many = Simulator(
        fleet(), active(), POLICIES["gtm"], busy_workload(), model=LLAMA_8B, duration_s=400.0
    )
    assert partition.probe_seconds(many) == 20.0
    # Past PROBE_ARRIVALS arrivals, up to the arrival that many in.
    long = build_requests(synthetic_trace(3000), Geography(PLACES), rate_rps=500.0, duration_s=20.0)
    assert len(long) > partition.PROBE_ARRIVALS
    busy = Simulator(fleet(), active(), POLICIES["gtm"], long, model=LLAMA_8B, duration_s=200.0)
    assert partition.probe_seconds(busy) == long[partition.PROBE_ARRIVALS].at_s


def test_a_spill_that_would_land_after_the_horizon_ends_where_it_was_sent() -> None:
    # With no drain, a request spilled in the window's last milliseconds reaches its
    # peer after the run: it must still end, exactly once, and in every worker count.
    sim = Simulator(
        fleet(), active(), POLICIES["gtm"], busy_workload(), model=LLAMA_8B,
        duration_s=25.0, drain_s=0.0,
    )  # fmt: skip
    late = Hop(25.01, 7, "us-west", 1, ("us-east",), 0.0, 34.0)
    sim.send(late)
    assert not sim.messages
    assert sim.out.ends[7] == 1
    assert sim.out.status[7] == Status.TIMED_OUT
    assert sim.out.reason[7] == "in flight at the horizon"


def test_a_worker_gone_mid_send_fails_the_run_with_its_traceback() -> None:
    # A worker that fails sends its traceback and exits; a peer sending to it then meets
    # a broken pipe, and must report the traceback, not the pipe.
    ours, theirs = Pipe(duplex=True)
    plan = partition.Plan((frozenset({"a"}), frozenset({"b"})), 0.035, {"a": 0, "b": 1})
    clocks = (ctypes.c_double * (partition.STRIDE * 4))()
    counters = (ctypes.c_int64 * (partition.STRIDE * 4))()
    peers = partition._Peers(0, plan, {1: ours}, clocks, counters)
    theirs.send(("error", "Traceback ...\nRuntimeError: boom in worker 1"))
    theirs.close()
    with pytest.raises(SimulationError, match="worker 1 failed:\nTraceback") as failed:
        _flood(peers)
    assert "boom in worker 1" in str(failed.value)
    # Gone without a word: said so.
    ours, theirs = Pipe(duplex=True)
    theirs.close()
    silent = partition._Peers(0, plan, {1: ours}, clocks, counters)
    with pytest.raises(SimulationError, match="worker 1 exited without a word"):
        _flood(silent)


def _flood(peers: partition._Peers) -> None:
    """Send worker 1 messages until its closed end shows (at once on Linux)."""
    for _ in range(10_000):
        peers._send(1, ("messages", [b"x" * 1_000]))

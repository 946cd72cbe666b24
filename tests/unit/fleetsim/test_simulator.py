import gc
import math
import random
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from fleetsim.bench import BenchConfig, run_bench
from fleetsim.fleet import FleetSpec, scaled_fleet
from fleetsim.geography import Geography, Place
from fleetsim.gpu import FastGpu, Job
from fleetsim.metrics import jain, summarise, tenant_service_share
from fleetsim.policies import POLICIES, SMOKE_POLICIES
from fleetsim.simulator import (
    RUN_GC_THRESHOLD,
    FaultPlan,
    RunResult,
    Simulator,
    Status,
    scale_quotas,
)
from fleetsim.traces import Trace, TraceKind, TraceRequest
from fleetsim.workload import SimRequest, build_requests
from gtm.errors import ConfigError
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.models import GeoPoint
from gtm.policy_store import ActivePolicy, activate
from policies import load_examples

PLACES = (
    Place("New York", "US", "NA", GeoPoint(lat=40.7, lon=-74.0), 8_000_000, -5.0),
    Place("Berlin", "DE", "EU", GeoPoint(lat=52.5, lon=13.4), 3_600_000, 1.0),
    Place("Tokyo", "JP", "AS", GeoPoint(lat=35.7, lon=139.7), 9_000_000, 9.0),
)


@cache
def active() -> ActivePolicy:
    return activate(1, load_examples())


def synthetic_trace(n: int = 400, seed: int = 1) -> Trace:
    rng = random.Random(seed)
    histories: list[list[int]] = [[] for _ in range(20)]
    out, t, next_id = [], 0.0, 0
    for _ in range(n):
        t += rng.expovariate(5.0)
        h = histories[rng.randrange(20)]
        h.extend((next_id, next_id + 1))
        next_id += 2
        out.append(TraceRequest(t, len(h) * 512 - 100, rng.randint(20, 300), tuple(h[-16:])))
    return Trace(TraceKind.MOONCAKE, "synthetic", tuple(out))


def workload(fleet: FleetSpec, rate: float = 20.0, duration: float = 20.0) -> list[SimRequest]:
    return build_requests(synthetic_trace(), Geography(PLACES), rate_rps=rate, duration_s=duration)


@pytest.mark.parametrize("name", ["gtm", "round-robin", "gorgo", "skywalker"])
def test_every_request_ends_exactly_once_and_kv_is_never_exceeded(name: str) -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    result = Simulator(fleet, active(), POLICIES[name], reqs, model=LLAMA_8B).run()
    o = result.outcomes
    assert len(reqs) > 100
    assert np.all(o.ends == 1)
    assert not np.any(o.status == Status.PENDING)
    assert result.max_kv_fraction <= 1.0
    ok = o.status == Status.OK
    assert np.all(o.e2e_s[ok] >= o.ttft_s[ok])
    assert o.violation.sum() == 0 or name != "gtm"
    # Every served request names the GPU that served it, in the region it is counted in.
    assert np.all(o.gpu[ok] >= 0)
    assert np.array_equal(result.gpu_region[o.gpu[ok]], o.region[ok])


def test_tokens_are_conserved() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    result = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B).run()
    summary = summarise(result, reqs)
    ok = result.outcomes.status == Status.OK
    served_out = sum(r.output_tokens for r, good in zip(reqs, ok, strict=True) if good)
    assert summary.output_tps * result.window_s == pytest.approx(served_out)
    assert summary.served + summary.refused + summary.timed_out + summary.failed == len(reqs)


def test_same_seed_same_result() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    a = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B).run().outcomes
    b = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B).run().outcomes
    assert np.array_equal(a.ttft_s, b.ttft_s, equal_nan=True)
    assert np.array_equal(a.region, b.region)


@pytest.fixture
def unfrozen_heap() -> Iterator[None]:
    """No object in the permanent generation (a serving command run in-process by an
    earlier test may have frozen the heap), and the process's state back afterwards."""
    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    yield
    if frozen:
        gc.freeze()


@pytest.mark.usefixtures("unfrozen_heap")
def test_a_run_freezes_the_heap_and_restores_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    sim = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B)
    seen: list[tuple[int, tuple[int, int, int]]] = []
    advance = sim.advance

    def spy(*args: object, **kwargs: object) -> float:
        seen.append((gc.get_freeze_count(), gc.get_threshold()))
        return advance(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sim, "advance", spy)
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    sim.run()
    # While it ran: the workload was in the permanent generation, collections rarer.
    assert seen
    assert seen[0][0] > len(reqs)
    assert seen[0][1] == (RUN_GC_THRESHOLD, before[1], before[2])
    # Afterwards the process's own settings are back.
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


@pytest.mark.usefixtures("unfrozen_heap")
def test_a_run_leaves_a_heap_frozen_by_the_process_frozen() -> None:
    fleet = scaled_fleet(active(), 12)
    sim = Simulator(fleet, active(), POLICIES["gtm"], workload(fleet), model=LLAMA_8B)
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        sim.run()
        # Not unfrozen (objects freed during the run leave the count, never more).
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_fast_gpu_never_exceeds_kv_and_finishes_everything() -> None:
    gpu = FastGpu("g", get_profile("L4", LLAMA_8B))
    rng = random.Random(3)
    jobs = [Job(i, rng.randint(1000, 9000), rng.randint(10, 500)) for i in range(200)]
    done = 0
    for job in jobs:
        done += len(gpu.add(job, 0.0).finished)
    while not gpu.idle():
        at = gpu.next_event_at()
        assert at is not None
        done += len(gpu.on_event(at).finished)
        assert gpu.used_blocks <= gpu.capacity_blocks
    assert done == 200
    assert gpu.used_blocks == 0


def test_smoke_benchmark_writes_a_report(tmp_path: object) -> None:
    from pathlib import Path

    out = Path(str(tmp_path))
    config = BenchConfig(gpus=12, loads=(0.85,), duration_s=15.0, policies=SMOKE_POLICIES)
    rows = run_bench(config, synthetic_trace(), PLACES, out_dir=out, echo=lambda _: None)
    assert [r.policy for r in rows[0.85]] == list(SMOKE_POLICIES)
    text = (out / "routing.md").read_text()
    assert "| gtm |" in text
    assert "residency violations: 0" in text


def test_parallel_runs_give_the_same_report_as_one_process() -> None:
    # --jobs 2: policies × loads in forked worker processes, results in report order.
    config = BenchConfig(
        gpus=12, loads=(0.5, 0.85), duration_s=8.0, policies=("gtm", "least-connections")
    )
    lines: list[str] = []
    alone = run_bench(config, synthetic_trace(), PLACES, echo=lambda _: None)
    forked = run_bench(replace(config, jobs=2), synthetic_trace(), PLACES, echo=lines.append)
    assert list(forked) == list(alone) == [0.5, 0.85]
    for load, rows in alone.items():
        assert [r.policy for r in forked[load]] == ["gtm", "least-connections"]
        for a, b in zip(rows, forked[load], strict=True):
            # Everything but the wall-clock figure.
            assert replace(a, sim_rps=0.0) == replace(b, sim_rps=0.0)
    assert "(2 jobs)" in lines[-1]


def overload(rate: float = 60.0, duration: float = 20.0) -> list[SimRequest]:
    return build_requests(
        synthetic_trace(1200), Geography(PLACES), rate_rps=rate, duration_s=duration
    )


@pytest.mark.parametrize("name", ["gtm", "round-robin"])
def test_overload_ends_every_request_and_reports_timeouts(name: str) -> None:
    # 3x what 6 GPUs serve: the client timeout, the regional queue TTL and the horizon
    # must end what is never served — counted, not dropped.
    fleet = scaled_fleet(active(), 12)
    reqs = overload()
    sim = Simulator(
        fleet, active(), POLICIES[name], reqs, model=LLAMA_8B, duration_s=20.0,
        drain_s=10.0, client_timeout_s=5.0,
    )  # fmt: skip
    result = sim.run()
    o = result.outcomes
    assert np.all(o.ends == 1)
    assert not np.any(o.status == Status.PENDING)
    assert (o.status == Status.TIMED_OUT).sum() > 0
    assert result.sim_s <= 30.0 + 1e-9
    summary = summarise(result, reqs)
    assert math.isinf(summary.ttft_p99)
    # Served requests got their first token before the client gave up — as the GPU sees
    # it, up to one tick late (jobs are expired at ticks); TTFT adds the network: the
    # client's RTT (≤ 0.31 s: 26 ms + 0.0143 ms/km over 20,000 km) and a spill hop.
    ok = o.status == Status.OK
    assert np.all(o.ttft_s[ok] <= 5.0 + sim.tick_s + 1.0)
    assert 0.0 < summary.gpu_busy <= 1.0


def test_quotas_refuse_over_limit_and_refund_nothing_twice() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = overload(rate=40.0)
    tight = Simulator(
        fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B, quota_scale=0.05
    ).run()
    loose = Simulator(
        fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B, quota_scale=1000.0
    ).run()
    tight_quota = sum(1 for r in tight.outcomes.reason if r.startswith("quota:"))
    loose_quota = sum(1 for r in loose.outcomes.reason if r.startswith("quota:"))
    assert tight_quota > 0
    assert loose_quota == 0
    assert np.all(tight.outcomes.ends == 1)


def test_scale_quotas_scales_every_limit_but_the_weight() -> None:
    tenant = active().tenants.get("demo-global")
    assert tenant is not None
    assert tenant.quotas is not None
    scaled = scale_quotas(tenant.quotas, 10.0)
    assert scaled.requests_per_minute == 10 * (tenant.quotas.requests_per_minute or 0)
    assert scaled.max_concurrent == 10 * (tenant.quotas.max_concurrent or 0)
    assert scaled.output_weight == tenant.quotas.output_weight


@pytest.mark.parametrize("name", ["gtm", "least-connections"])
def test_crashed_gpus_fail_their_requests_then_get_none(name: str) -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet, rate=20.0, duration=20.0)
    plan = FaultPlan(crash_fraction=0.25, crash_at_s=5.0, detect_s=1.0)
    sim = Simulator(fleet, active(), POLICIES[name], reqs, model=LLAMA_8B, faults=plan)
    result = sim.run()
    o = result.outcomes
    assert result.crashed_gpus == 3
    assert np.all(o.ends == 1)
    failed = o.status == Status.FAILED
    assert failed.sum() > 0
    # After detection nothing is sent to a dead GPU: failures are only around the crash.
    at = np.array([r.at_s for r in reqs])
    assert np.all(at[failed] <= 5.0 + 1.0 + 1.0)
    for k in sim.crash_set:
        gpu = sim.gpu_list[k]
        assert gpu.idle()
        assert gpu.used_blocks == 0


def test_slow_gpus_make_latency_worse_and_runs_stay_deterministic() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    plan = FaultPlan(slow_fraction=0.5, slowdown=3.0)

    def run(faults: FaultPlan | None) -> float:
        result = Simulator(
            fleet, active(), POLICIES["round-robin"], reqs, model=LLAMA_8B, faults=faults
        ).run()
        return summarise(result, reqs).e2e_p50

    assert run(plan) > run(None)
    assert run(plan) == run(plan)


def test_fleet_shaped_by_weights_keeps_a_gpu_per_zone() -> None:
    fleet = scaled_fleet(active(), 60, weights=[10, 0, 0, 30, 0, 20])
    counts = [sum(len(z.gpus) for z in r.zones) for r in fleet.regions]
    assert sum(counts) == 60
    assert min(counts) == 2
    assert counts[3] > counts[5] > counts[0] > counts[1]


def test_jain_is_one_when_every_tenant_gets_the_same_share() -> None:
    reqs = workload(scaled_fleet(active(), 12))
    met = np.ones(len(reqs), dtype=np.bool_)
    assert jain(tenant_service_share(reqs, met)) == pytest.approx(1.0)
    only_first = np.array([r.tenant == reqs[0].tenant for r in reqs])
    assert jain(tenant_service_share(reqs, only_first)) < 0.7


def test_cross_region_is_measured_from_the_clients_nearest_region() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    for name in ("round-robin", "gtm"):
        sim = Simulator(fleet, active(), POLICIES[name], reqs, model=LLAMA_8B)
        result = sim.run()
        o = result.outcomes
        ok = o.status == Status.OK
        nearest = [
            min(sim.region_ids, key=lambda r: r_.point.distance_km(sim.regions[r].location))
            for r_ in reqs
        ]
        home = np.array([sim.region_index[r] for r in nearest])
        assert np.array_equal(o.home, home)
        expected = float((o.region[ok] != home[ok]).mean())
        assert summarise(result, reqs).cross_region == pytest.approx(expected)
        if name == "round-robin":
            # Nearest-allowed routing: only residency can move a client away.
            assert expected == 0.0


def test_fleet_from_a_gtm_up_topology_has_exactly_its_gpus() -> None:
    from bench.sim_fidelity import MODEL, topology
    from fleetsim.fleet import fleet_from_topology
    from gtm.topology import resolve

    topo = topology()
    fleet = fleet_from_topology(active(), topo, MODEL)
    placed = resolve(topo, active().policy_set.regions).gpus
    assert fleet.gpu_count == 16 == len(placed)
    ids = sorted(g for r in fleet.regions for z in r.zones for g, _ in z.gpus)
    assert ids == sorted(g.id for g in placed)
    with pytest.raises(ConfigError, match="serves"):
        fleet_from_topology(active(), topo, "no/such-model")


def test_gtm_sim_command_prints_simulated_requests_per_second(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fleetsim.cli import sim

    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "\n".join(
            f'{{"timestamp": {k * 100}, "input_length": {600 + 7 * k}, '
            f'"output_length": {20 + k % 50}, "hash_ids": [{k % 9}, {k}]}}'
            for k in range(300)
        )
    )
    result = CliRunner().invoke(
        sim,
        ["--trace-path", str(trace), "--gpus", "12", "--duration", "8", "--out",
         str(tmp_path / "out"), "--policy", "gtm,least-connections", "--crash-fraction",
         "0.1", "--crash-at", "3", "--scrape-interval", "0.25"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "simulated req/s" in result.output
    report = (tmp_path / "out" / "sim.md").read_text()
    assert "| gtm |" in report
    assert "crash at 3 s" in report
    assert "zone agents scrape their GPUs every 0.25 s" in report
    bad = CliRunner().invoke(sim, ["--trace-path", str(trace), "--policy", "nope"])
    assert bad.exit_code == 2
    assert "unknown policies" in bad.output


@pytest.mark.parametrize("pass_level", [False, True])
def test_a_scrape_shows_the_zone_agent_each_gpus_batch_and_kv_use(pass_level: bool) -> None:
    from fleetsim.passgpu import use_pass_level

    fleet = scaled_fleet(active(), 12)
    sim = Simulator(fleet, active(), POLICIES["gtm"], [], model=LLAMA_8B, scrape_s=0.25)
    if pass_level:
        use_pass_level(sim)
    pool = next(iter(sim.pools.values()))
    gpu_id, gpu = next(iter(pool.gpus.items()))
    for i in range(3):
        gpu.add(Job(i, 4000, 100), 0.0)
    pool.scrape(0.5, LLAMA_8B)
    index = pool.view.by_model[LLAMA_8B]
    at = index.ids.index(gpu_id)
    running, waiting, used = gpu.scrape()
    assert running + waiting == 3
    assert used > 0
    assert index.fresh[at]
    assert index.running[at] == running
    assert index.waiting[at] == waiting
    assert index.kv_usage[at] == pytest.approx(used / gpu.capacity_blocks)
    # The other GPUs were scraped too, idle.
    others = [k for k in range(len(index.ids)) if k != at]
    assert all(index.fresh[k] and index.running[k] == 0 for k in others)
    # Nothing changed by the next scrape: the same view stands (it would be equal).
    view = pool.view
    pool.scrape(0.75, LLAMA_8B)
    assert pool.view is view


def test_runs_with_scrapes_end_every_request_once_and_repeat_exactly() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet, rate=40.0)

    def run() -> RunResult:
        sim = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B, scrape_s=0.25)
        result = sim.run()
        assert sim.scrapes >= 4 * 20
        return result

    a, b = run(), run()
    assert np.all(a.outcomes.ends == 1)
    assert np.array_equal(a.outcomes.ttft_s, b.outcomes.ttft_s, equal_nan=True)
    assert np.array_equal(a.outcomes.gpu, b.outcomes.gpu)


def test_scrape_interval_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="scrape interval"):
        Simulator(scaled_fleet(active(), 12), active(), POLICIES["gtm"], [], model=LLAMA_8B,
                  scrape_s=0.0)  # fmt: skip

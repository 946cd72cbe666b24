import random
from functools import cache

import numpy as np
import pytest

from fleetsim.sim.bench import BenchConfig, run_bench
from fleetsim.sim.fleet import FleetSpec, scaled_fleet
from fleetsim.sim.gpu import FastGpu, Job
from fleetsim.sim.metrics import summarise
from fleetsim.sim.policies import POLICIES, SMOKE_POLICIES
from fleetsim.sim.simulator import Simulator, Status
from fleetsim.sim.workload import SimRequest, build_requests
from fleetsim.traces import Trace, TraceKind, TraceRequest
from fleetsim.workload import Geography, Place
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


def test_tokens_are_conserved() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    result = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B).run()
    summary = summarise(result, reqs)
    ok = result.outcomes.status == Status.OK
    served_out = sum(r.output_tokens for r, good in zip(reqs, ok, strict=True) if good)
    assert summary.output_tps * result.sim_s == pytest.approx(served_out)
    assert summary.served + summary.refused + summary.timed_out == len(reqs)


def test_same_seed_same_result() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet)
    a = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B).run().outcomes
    b = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B).run().outcomes
    assert np.array_equal(a.ttft_s, b.ttft_s, equal_nan=True)
    assert np.array_equal(a.region, b.region)


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

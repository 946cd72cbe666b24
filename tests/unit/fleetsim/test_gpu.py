"""The analytic GPU against the emulator's pass-level engine (:class:`PassGpu` wraps
:class:`gpusim.engine.Engine`, the scheduler the live emulated workers run)."""

import random
from collections.abc import Sequence

import numpy as np
import pytest

from fleetsim.fleet import scaled_fleet
from fleetsim.gpu import FastGpu, Job
from fleetsim.passgpu import PassGpu, use_pass_level
from fleetsim.policies import POLICIES
from fleetsim.simulator import Simulator, Status
from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import LLAMA_8B, get_profile

from .test_simulator import active, workload

Arrival = tuple[float, int, int]  # (at, prompt tokens, output tokens)


def drive(gpu: FastGpu | PassGpu, arrivals: Sequence[Arrival]) -> tuple[np.ndarray, np.ndarray]:
    """Feed ``arrivals`` (sorted) to one GPU; (TTFT, end-to-end) per request."""
    jobs: list[Job] = []
    pending = list(arrivals)
    while pending or not gpu.idle() or gpu.waiting:
        at = gpu.next_event_at()
        if pending and (at is None or pending[0][0] <= at):
            when, prompt, output = pending.pop(0)
            job = Job(len(jobs), prompt, output)
            jobs.append(job)
            gpu.add(job, when)
        else:
            assert at is not None
            gpu.on_event(at)
    ttft = np.array([j.first_token_at - j.arrived_at for j in jobs])
    e2e = np.array([j.finished_at - j.arrived_at for j in jobs])
    return ttft, e2e


def poisson(rate: float, n: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.randint(200, 12_000), rng.randint(20, 600)))
    return out


def fast(gpu_type: str, warm_up: bool = False) -> FastGpu:
    gpu = FastGpu("g", get_profile(gpu_type, LLAMA_8B))
    if warm_up:
        gpu.start_warm_up()
    return gpu


def passes(gpu_type: str, warm_up: bool = False) -> PassGpu:
    return PassGpu("g", get_profile(gpu_type, LLAMA_8B), warm_up=warm_up)


@pytest.mark.parametrize("gpu_type", ["H100", "A100-80GB", "L40S"])
@pytest.mark.parametrize("warm_up", [False, True])
@pytest.mark.parametrize(("prompt", "output"), [(100, 200), (8000, 1), (2000, 50)])
def test_a_lone_request_takes_what_the_engine_says(
    gpu_type: str, warm_up: bool, prompt: int, output: int
) -> None:
    f_ttft, f_e2e = drive(fast(gpu_type, warm_up), [(0.0, prompt, output)])
    p_ttft, p_e2e = drive(passes(gpu_type, warm_up), [(0.0, prompt, output)])
    assert f_ttft[0] == pytest.approx(p_ttft[0], rel=0.02)
    assert f_e2e[0] == pytest.approx(p_e2e[0], rel=0.02)


def test_warm_up_slows_the_first_passes_then_ends() -> None:
    cold, warm = fast("H100", warm_up=True), fast("H100")
    assert cold.warm_factor > 1.0
    c_ttft, c_e2e = drive(cold, [(0.0, 4000, 300)])
    w_ttft, w_e2e = drive(warm, [(0.0, 4000, 300)])
    # The first pass runs ~2x slower (Degradation's initial factor) ...
    assert c_ttft[0] == pytest.approx(w_ttft[0] * Degradation().warmup_initial_factor, rel=0.05)
    # ... and after 64 passes the GPU is warm: the rest of the request is not slowed.
    assert cold.warm_factor == 1.0
    assert cold.passes > Degradation().warmup_passes
    extra = (c_e2e[0] - c_ttft[0]) - (w_e2e[0] - w_ttft[0])
    assert 0.0 < extra < Degradation().warmup_passes * warm._pass_time()[0] * 1.5


def test_an_arrival_during_a_pass_waits_for_its_end_on_average() -> None:
    """A request arriving while a long decode runs joins at the next pass boundary:
    over arrival instants spread across passes, the mean TTFT matches the engine's."""
    f_all, p_all = [], []
    for k in range(20):
        offset = 1.0 + k * 0.0013  # spread over a few decode passes (~8 ms each)
        arrivals = [(0.0, 100, 400), (offset, 500, 5)]
        f_all.append(drive(fast("H100"), arrivals)[0][1])
        p_all.append(drive(passes("H100"), arrivals)[0][1])
    assert np.mean(f_all) == pytest.approx(np.mean(p_all), rel=0.05)
    # Without the wait the analytic TTFT would be a pass shorter on average.
    lone = drive(fast("H100"), [(0.0, 500, 5)])[0][0]
    assert np.mean(f_all) > lone


@pytest.mark.parametrize(("gpu_type", "rate"), [("H100", 1.0), ("A100-80GB", 0.5), ("L40S", 0.5)])
def test_moderate_load_per_request_times_agree_with_the_engine(gpu_type: str, rate: float) -> None:
    # Measured over seeds 1-5: per-request TTFT ratio 0.985-0.998, median TTFT ratio
    # 0.95-1.00 (the analytic model a little optimistic: no preemption), E2E within 1 %.
    arrivals = poisson(rate, 200, seed=3)
    f_ttft, f_e2e = drive(fast(gpu_type), arrivals)
    p_ttft, p_e2e = drive(passes(gpu_type), arrivals)
    assert np.median(f_ttft / p_ttft) == pytest.approx(1.0, abs=0.03)
    assert np.median(f_e2e / p_e2e) == pytest.approx(1.0, abs=0.02)
    assert np.median(f_ttft) == pytest.approx(np.median(p_ttft), rel=0.06)
    assert np.median(f_e2e) == pytest.approx(np.median(p_e2e), rel=0.02)


def test_the_simulator_runs_on_pass_level_gpus_and_ends_everything_once() -> None:
    fleet = scaled_fleet(active(), 12)
    reqs = workload(fleet, rate=10.0, duration=5.0)
    sim = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B)
    use_pass_level(sim, warm_up=True)
    assert all(isinstance(g, PassGpu) for g in sim.gpu_list)
    result = sim.run()
    o = result.outcomes
    assert len(reqs) > 30
    assert np.all(o.ends == 1)
    ok = o.status == Status.OK
    assert ok.mean() > 0.9
    assert np.all(o.ttft_s[ok] <= o.e2e_s[ok])
    assert result.max_kv_fraction <= 1.0
    again = Simulator(fleet, active(), POLICIES["gtm"], reqs, model=LLAMA_8B)
    use_pass_level(again, warm_up=True)
    assert np.array_equal(again.run().outcomes.ttft_s, o.ttft_s, equal_nan=True)

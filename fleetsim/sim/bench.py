"""One side-by-side benchmark: every policy on identical arrivals, at each load."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetsim.sim.fleet import scaled_fleet
from fleetsim.sim.metrics import Summary, summarise
from fleetsim.sim.policies import POLICIES, policy
from fleetsim.sim.report import write_report
from fleetsim.sim.simulator import RunResult, Simulator
from fleetsim.sim.workload import SimRequest, build_requests, fleet_capacity_rps
from fleetsim.traces import Trace
from fleetsim.workload import Geography, Place
from gtm.policy_store import activate
from policies import load_examples


@dataclass(frozen=True, slots=True)
class BenchConfig:
    gpus: int = 48
    regions: int = 6
    loads: tuple[float, ...] = (0.85,)
    duration_s: float = 60.0
    policies: tuple[str, ...] = tuple(POLICIES)
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    seed: int = 0
    max_input: int = 32_768


def run_bench(
    config: BenchConfig,
    trace: Trace,
    places: tuple[Place, ...],
    *,
    out_dir: Path | None = None,
    echo: Callable[[str], None] = print,
) -> dict[float, list[Summary]]:
    active = activate(1, load_examples())
    fleet = scaled_fleet(active, config.gpus, config.regions)
    capacity = fleet_capacity_rps(fleet.gpu_types(), config.model, trace)
    geography = Geography(places, seed=config.seed)
    per_load: dict[float, list[Summary]] = {}
    results: dict[float, list[RunResult]] = {}
    for load in config.loads:
        requests: Sequence[SimRequest] = build_requests(
            trace, geography, rate_rps=load * capacity, duration_s=config.duration_s,
            max_input=config.max_input,
        )  # fmt: skip
        echo(
            f"load {load:.0%}: {len(requests):,} requests over {config.duration_s:g} simulated s "
            f"({load * capacity:,.1f} req/s; fleet {fleet.gpu_count} GPUs in "
            f"{len(fleet.regions)} regions, capacity ≈ {capacity:,.1f} req/s)"
        )
        rows, runs = [], []
        for name in config.policies:
            started = time.perf_counter()
            sim = Simulator(
                fleet, active, policy(name), requests, model=config.model,
                duration_s=config.duration_s, progress=_progress(name, config.duration_s),
                seed=config.seed,
            )  # fmt: skip
            result = sim.run()
            summary = summarise(result, list(requests))
            sys.stderr.write("\r\033[K")
            echo(
                f"  {name:<26} TTFT p50 {summary.ttft_p50:7.2f} s  p99 {summary.ttft_p99:8.2f} s"
                f"  goodput {summary.goodput_rps:7.1f} req/s  {summary.sim_rps:,.0f} simulated "
                f"req/s ({time.perf_counter() - started:.1f} s wall)"
            )
            rows.append(summary)
            runs.append(result)
        per_load[load] = rows
        results[load] = runs
    if out_dir is not None:
        path = write_report(
            out_dir,
            "Routing benchmark",
            per_load,
            results,
            preamble=(
                f"Trace `{trace.source}` ({trace.kind.value}); {fleet.gpu_count} GPUs in "
                f"{len(fleet.regions)} regions; model {config.model}; "
                f"{config.duration_s:g} simulated s per run; seed {config.seed}. "
                "Simulator: fleetsim/sim (analytic GPU model, tiers' real decision code)."
            ),
        )
        echo(f"report: {path}")
    return per_load


def _progress(name: str, duration_s: float) -> Callable[[float], None]:
    def show(at: float) -> None:
        done = min(1.0, at / duration_s) if duration_s > 0 else 1.0
        bar = "#" * int(30 * done)
        sys.stderr.write(f"\r  {name:<26} [{bar:<30}] {done:4.0%}")
        sys.stderr.flush()

    return show

"""Fleet simulator at scale: gtm (all three tiers' real decisions) on 1,000 and 10,000 GPUs.

Issue 10's scale targets: 1,000 GPUs × 10 simulated minutes at 85 % load in < 10 min
wall, 10,000 GPUs × 2 simulated minutes, ≥ 5,000 simulated requests per wall second.
Each run is simulated over ``--workers`` processes (default: one per core, the regions
split between them: :mod:`fleetsim.partition`). Prints, per run: requests, wall and
CPU seconds (this process and its workers), simulated requests per wall and per CPU
second, where the workers' time went (global / regional / zone decisions, summary
publishing, waiting for each other, the simulator itself), and the quality figures;
writes ``reports/scale.md``.

Measured in the same run on the same arrivals, each pair required to end every request
identically (checked): the simulator building the regional tier's full decision trace
per request (``regional_fast_path=False``) against deciding without it (the trace is
lazy), CPU seconds compared; and one process against the workers, wall seconds compared.

    python bench/fleet_scale.py            # 1,000 GPUs × 600 s and 10,000 GPUs × 120 s
    python bench/fleet_scale.py --smoke    # 60 GPUs × 20 s
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetsim.bench import BenchConfig, prepare
from fleetsim.geography import CITIES_FILE, Geography, read_places
from fleetsim.metrics import Summary, summarise
from fleetsim.policies import policy
from fleetsim.report import table
from fleetsim.simulator import RunResult, Simulator
from fleetsim.traces import TraceKind, data_dir, load_trace
from fleetsim.workload import build_requests
from gtm.policy_store import activate
from policies import load_examples

#: (GPUs, simulated s, wall-clock limit s or None) of the issue's scale targets.
FULL: tuple[tuple[int, float, float | None], ...] = ((1_000, 600.0, 600.0), (10_000, 120.0, None))
SMOKE: tuple[tuple[int, float, float | None], ...] = ((60, 20.0, None),)
TARGET_RPS = 5_000
#: (GPUs, simulated s) of the fast path vs reference comparison (full run, smoke run).
COMPARE = (1_000, 20.0)
COMPARE_SMOKE = (60, 10.0)
#: (GPUs, simulated s) of the one process vs several workers comparison.
WORKERS_COMPARE = (1_000, 60.0)
WORKERS_SMOKE = (60, 10.0)


@dataclass(frozen=True, slots=True)
class Scale:
    gpus: int
    duration_s: float
    requests: int
    wall_s: float
    cpu_s: float
    limit_s: float | None
    result: RunResult
    summary: Summary


def run(
    gpus: int, duration_s: float, load: float, limit_s: float | None, *, fast: bool = True,
    workers: int = 1,
) -> Scale:  # fmt: skip
    config = BenchConfig(gpus=gpus, duration_s=duration_s, loads=(load,), policies=("gtm",))
    trace = load_trace(TraceKind.MOONCAKE)
    places = read_places(data_dir() / CITIES_FILE)
    setup = prepare(config, trace, places)
    requests = build_requests(
        trace, Geography(places, seed=config.seed), rate_rps=load * setup.capacity_rps,
        duration_s=duration_s,
    )  # fmt: skip
    print(
        f"{gpus:,} GPUs × {duration_s:g} s at {load:.0%}: {len(requests):,} requests"
        + ("" if fast else " (regional reference profile)")
        + (f", {workers} workers" if workers > 1 else ", one process"),
        flush=True,
    )
    started_cpu = _cpu_s()
    started = time.perf_counter()
    sim = Simulator(
        setup.fleet, activate(1, load_examples()), policy("gtm"), requests,
        model=config.model, duration_s=duration_s, quota_scale=setup.quota_scale,
        progress=_progress(len(requests), duration_s, config.drain_s),
        regional_fast_path=fast, workers=workers,
    )  # fmt: skip
    result = sim.run()
    wall = time.perf_counter() - started
    cpu = _cpu_s() - started_cpu
    sys.stderr.write("\r\033[K")
    return Scale(
        gpus, duration_s, len(requests), wall, cpu, limit_s, result,
        summarise(result, list(requests), setup.capacity_tps),
    )  # fmt: skip


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (a partitioned run's
    workers and probe)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def default_workers() -> int:
    """One worker per core this process may use (the issue's 2-core machine: 2), at
    most one per region."""
    return max(1, min(len(os.sched_getaffinity(0)), 6))


def _progress(total: int, window: float, drain: float):  # type: ignore[no-untyped-def]
    started = time.perf_counter()

    def show(at: float) -> None:
        done = min(1.0, at / (window + drain))
        wall = time.perf_counter() - started
        rate = total * min(1.0, at / window) / max(wall, 1e-9)
        sys.stderr.write(
            f"\r  [{'#' * int(30 * done):<30}] sim {at:6.0f} s  {wall:6.0f} s wall  "
            f"~{rate:,.0f} req/s"
        )
        sys.stderr.flush()

    return show


def lines(runs: list[Scale]) -> list[str]:
    out = [
        "| GPUs | simulated s | requests | workers | wall s | CPU s | sim req/s (wall) "
        "| sim req/s (CPU) | global | regional | zone | publish | waiting | simulator |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        # Shares of the workers' time (wall × workers; tier times are summed over them).
        spent = max(r.wall_s * r.result.workers, 1e-9)
        share = {k: v / spent for k, v in r.result.tier_wall_s.items()}
        waiting = sum(r.result.worker_waited_s) / spent
        rest = max(0.0, 1.0 - sum(share.values()) - waiting)
        out.append(
            f"| {r.gpus:,} | {r.duration_s:g} | {r.requests:,} | {r.result.workers} | "
            f"{r.wall_s:,.0f} | {r.cpu_s:,.0f} | {r.requests / r.wall_s:,.0f} | "
            f"{r.requests / r.cpu_s:,.0f} | "
            f"{share.get('global', 0):.0%} | {share.get('regional', 0):.0%} | "
            f"{share.get('zone', 0):.0%} | {share.get('publish', 0):.0%} | {waiting:.0%} | "
            f"{rest:.0%} |"
        )
    out += ["", "Targets:", ""]
    for r in runs:
        if r.limit_s is not None:
            ok = r.wall_s < r.limit_s
            out.append(
                f"- {'met' if ok else '**MISSED**'}: {r.gpus:,} GPUs × {r.duration_s:g} "
                f"simulated s in {r.wall_s:,.0f} s wall (< {r.limit_s:g} s)"
            )
        else:
            target = next((d for g, d, _ in FULL if g == r.gpus), math.inf)
            if math.isinf(target):
                out.append(f"- no scale target at {r.gpus:,} GPUs (a smoke or custom run)")
            elif r.duration_s >= target:
                out.append(
                    f"- met: {r.gpus:,} GPUs × {r.duration_s:g} simulated s ran "
                    f"({r.wall_s:,.0f} s wall)"
                )
            else:
                out.append(
                    f"- not measured: {r.gpus:,} GPUs × {r.duration_s:g} simulated s is "
                    f"shorter than the target's {target:g} s"
                )
        rps = r.requests / r.wall_s
        out.append(
            f"- {'met' if rps >= TARGET_RPS else '**MISSED**'}: {rps:,.0f} simulated "
            f"requests per wall second at {r.gpus:,} GPUs (target {TARGET_RPS:,}; "
            f"{r.requests / r.cpu_s:,.0f} per CPU second)"
        )
    out += ["", "Quality (gtm):", "", table([r.summary for r in runs])]
    return out


def compare(gpus: int, duration_s: float, load: float) -> list[str]:
    """The same run with the regional fast path and with the reference profile: the
    outcomes must be identical; the CPU seconds are compared. Each runs twice, in turn
    (fast, reference, fast, reference), and the faster of its two runs counts: the first
    run of a process pays one-time costs (imports, caches) the others do not."""
    runs = [run(gpus, duration_s, load, None, fast=k % 2 == 0) for k in range(4)]
    fast = min(runs[0::2], key=lambda r: r.cpu_s)
    slow = min(runs[1::2], key=lambda r: r.cpu_s)
    a, b = fast.result.outcomes, slow.result.outcomes
    same = (
        all(
            np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True)
            for name in ("status", "ttft_s", "e2e_s", "region", "cached", "ends")
        )
        and a.reason == b.reason
        and fast.result.spills == slow.result.spills
    )
    if not same:
        raise SystemExit("the regional fast path changed the simulation's outcomes: a bug")

    def share(r: Scale) -> float:
        return r.result.tier_wall_s.get("regional", 0.0) / max(r.wall_s, 1e-9)

    return [
        f"Regional fast path vs the reference profile, same {fast.requests:,} requests "
        f"({gpus:,} GPUs × {duration_s:g} s), outcomes identical:",
        "",
        "| regional path | CPU s | sim req/s (CPU) | regional share of wall |",
        "|---|---:|---:|---:|",
        *(
            f"| {label} | {r.cpu_s:,.1f} | {r.requests / r.cpu_s:,.0f} | {share(r):.0%} |"
            for label, r in (("fast path", fast), ("reference profile", slow))
        ),
        "",
        f"- fast path: {slow.cpu_s / fast.cpu_s:.2f}× the reference's simulated requests "
        "per CPU second",
    ]


def compare_workers(gpus: int, duration_s: float, load: float, workers: int) -> list[str]:
    """The same run in one process and over ``workers`` (fleetsim.partition): the
    outcomes must be identical; the wall seconds are compared."""
    one = run(gpus, duration_s, load, None, workers=1)
    many = run(gpus, duration_s, load, None, workers=workers)
    a, b = one.result.outcomes, many.result.outcomes
    same = (
        all(
            np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True)
            for name in ("status", "ttft_s", "e2e_s", "region", "gpu", "cached", "ends")
        )
        and a.reason == b.reason
        and one.result.spills == many.result.spills
    )
    if not same:
        raise SystemExit("the partitioned run changed the simulation's outcomes: a bug")
    return [
        f"One process vs {many.result.workers} workers, same {one.requests:,} requests "
        f"({gpus:,} GPUs × {duration_s:g} s), outcomes identical:",
        "",
        "| processes | wall s | CPU s | sim req/s (wall) | waiting (per worker, s) |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {r.result.workers} | {r.wall_s:,.1f} | {r.cpu_s:,.1f} | "
            f"{r.requests / r.wall_s:,.0f} | "
            f"{', '.join(f'{w:.1f}' for w in r.result.worker_waited_s) or '—'} |"
            for r in (one, many)
        ),
        "",
        f"- {many.result.workers} workers: {one.wall_s / many.wall_s:.2f}× one process's "
        "simulated requests per wall second",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--only", type=int, help="run only the scale with this many GPUs")
    parser.add_argument(
        "--duration", type=float, help="simulated seconds instead of the target's (shorter runs)"
    )
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="skip the comparisons (regional fast path vs reference profile; one process "
        "vs --workers)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="processes each run is simulated over (default: one per core, at most 6)",
    )
    args = parser.parse_args()
    plan = SMOKE if args.smoke else FULL
    if args.only is not None:
        plan = tuple(p for p in plan if p[0] == args.only)
    if args.duration is not None:
        # A shorter run measures the speed, not the wall-clock target of the full one.
        plan = tuple((g, args.duration, None) for g, _, _ in plan)
    compared: list[str] = []
    if not args.no_compare:
        compared = compare(*(COMPARE_SMOKE if args.smoke else COMPARE), args.load)
        print("\n".join(compared), flush=True)
        if args.workers > 1:
            size = WORKERS_SMOKE if args.smoke else WORKERS_COMPARE
            against_one = compare_workers(*size, args.load, args.workers)
            print("\n".join(against_one), flush=True)
            compared += ["", *against_one]
    runs = []
    for gpus, duration, limit in plan:
        runs.append(run(gpus, duration, args.load, limit, workers=args.workers))
        print("\n".join(lines(runs[-1:])), flush=True)
    text = [
        "# Fleet simulator at scale",
        "",
        f"gtm on the Mooncake conversation trace at {args.load:.0%} load, demand-shaped "
        "fleet, quotas on; `python bench/fleet_scale.py`. The wall-time columns say where "
        "the time went: inside each tier's decision code, publishing summaries and "
        "rebuilding the views every simulated second, and the simulator's own work.",
        "",
        *lines(runs),
        "",
        *compared,
    ]
    if not args.smoke:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scale.md").write_text("\n".join(text) + "\n", encoding="utf-8")
        print(f"report: {args.out / 'scale.md'}")


if __name__ == "__main__":
    main()

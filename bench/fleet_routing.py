"""The side-by-side routing benchmark in the fleet simulator (``gtm bench routing``).

    python bench/fleet_routing.py            # 48 GPUs, 6 regions, all policies, 0.85 load
    python bench/fleet_routing.py --load 0.85,1.2 --gpus 1000
    python bench/fleet_routing.py --smoke    # 12 GPUs, 4 policies, 20 simulated s
    python bench/fleet_routing.py --gpus 120 --duration 60 --seeds 0,1 --policies \
        gtm,gtm-no-ledger,llm-d-blend,least-connections,round-robin

With several seeds it prints gtm's ratios against round robin, the best baseline and
least connections per seed and their range (a target met on one seed only is not met).
``gtm-no-ledger`` (gtm without its global in-flight ledger) measures the ledger in the
same run.

Load = offered req/s ÷ the fleet's capacity (fleetsim/README.md); at load ≥ 1 the
report also checks gtm's capacity used (≥ 90 %).

Prints simulated requests per wall-clock second and the quality table; the report and
plots go to reports/.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleetsim.bench import BenchConfig, run_bench
from fleetsim.geography import CITIES_FILE, read_places
from fleetsim.metrics import Summary
from fleetsim.policies import POLICIES, SMOKE_POLICIES
from fleetsim.report import table, targets
from fleetsim.traces import TraceKind, data_dir, load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--gpus", type=int, default=48)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--load", default="0.85", help="comma-separated loads")
    parser.add_argument(
        "--out", type=Path, help="report directory (default: reports/; none with --smoke)"
    )
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    parser.add_argument("--policies", default="", help="comma-separated (default: all)")
    args = parser.parse_args()
    names = tuple(x.strip() for x in args.policies.split(",") if x.strip())
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    trace = load_trace(TraceKind.MOONCAKE)
    places = read_places(data_dir() / CITIES_FILE)
    # A smoke run (make bench) must not overwrite the real report.
    out = args.out if args.out is not None else (None if args.smoke else Path("reports"))
    by_seed: dict[int, Mapping[float, Sequence[Summary]]] = {}
    for seed in seeds:
        config = BenchConfig(
            gpus=12 if args.smoke else args.gpus,
            loads=tuple(float(x) for x in args.load.split(",") if x.strip()),
            duration_s=20.0 if args.smoke else args.duration,
            policies=names or (SMOKE_POLICIES if args.smoke else tuple(POLICIES)),
            seed=seed,
        )
        # The first seed writes OUT/routing.md, the others OUT/routing-seed<N>.md.
        name = "routing" if seed == seeds[0] else f"routing-seed{seed}"
        by_seed[seed] = rows = run_bench(config, trace, places, out_dir=out, report_name=name)
        for load, summaries in rows.items():
            print(f"\nseed {seed}, load {load:.0%}\n{table(summaries)}\n")
            print("\n".join(targets(summaries, load)))
    if len(by_seed) > 1:
        print("\n" + "\n".join(ratio_lines(by_seed)))


def ratio_lines(by_seed: Mapping[int, Mapping[float, Sequence[Summary]]]) -> list[str]:
    """gtm's ratios per load: one figure per seed, then their range."""
    lines = ["gtm vs peers, per seed (range):"]
    loads = sorted({load for rows in by_seed.values() for load in rows})
    for load in loads:
        parts: dict[str, list[float]] = {}
        for rows in by_seed.values():
            for label, value in _ratios(rows.get(load, ())).items():
                parts.setdefault(label, []).append(value)
        for label, values in parts.items():
            each = ", ".join(f"{v:.2f}" for v in values)
            span = f"{min(values):.2f}–{max(values):.2f}"
            lines.append(f"  load {load:.0%}  {label:<44} {each}  (range {span})")
    return lines


def _ratios(rows: Sequence[Summary]) -> dict[str, float]:
    by = {r.policy: r for r in rows}
    ours = by.get("gtm")
    if ours is None:
        return {}
    out: dict[str, float] = {}
    rr = by.get("round-robin")
    if rr is not None and rr.ttft_p99 > 0:
        out["p99 TTFT / round robin's (target ≤ 0.5)"] = ours.ttft_p99 / rr.ttft_p99
    baselines = [r for r in rows if not r.policy.startswith("gtm") and r.ttft_p99 > 0]
    if baselines:
        best = min(baselines, key=lambda r: r.ttft_p99)
        out["p99 TTFT / best baseline's (target ≤ 0.8)"] = ours.ttft_p99 / best.ttft_p99
    lc = by.get("least-connections")
    if lc is not None and lc.goodput_rps > 0:
        out["goodput / least connections' (target ≥ 1.2)"] = ours.goodput_rps / lc.goodput_rps
    ablation = by.get("gtm-no-ledger")
    if ablation is not None and ablation.ttft_p99 > 0:
        out["p99 TTFT / gtm-no-ledger's"] = ours.ttft_p99 / ablation.ttft_p99
    return {k: v for k, v in out.items() if not math.isnan(v)}


if __name__ == "__main__":
    main()

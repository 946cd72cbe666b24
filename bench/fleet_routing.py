"""The side-by-side routing benchmark in the fleet simulator (``gtm bench routing``).

    python bench/fleet_routing.py            # 48 GPUs, 6 regions, all policies, 0.85 load
    python bench/fleet_routing.py --load 0.85,1.2 --gpus 1000
    python bench/fleet_routing.py --smoke    # 12 GPUs, 4 policies, 20 simulated s

Load = offered req/s ÷ the fleet's capacity (fleetsim/sim/README.md); at load ≥ 1 the
report also checks gtm's capacity used (≥ 90 %).

Prints simulated requests per wall-clock second and the quality table; the report and
plots go to reports/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetsim.sim.bench import BenchConfig, run_bench
from fleetsim.sim.policies import POLICIES, SMOKE_POLICIES
from fleetsim.sim.report import table, targets
from fleetsim.traces import TraceKind, data_dir, load_trace
from fleetsim.workload import CITIES_FILE, read_places


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--gpus", type=int, default=48)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--load", default="0.85", help="comma-separated loads")
    parser.add_argument(
        "--out", type=Path, help="report directory (default: reports/; none with --smoke)"
    )
    args = parser.parse_args()
    config = BenchConfig(
        gpus=12 if args.smoke else args.gpus,
        loads=tuple(float(x) for x in args.load.split(",") if x.strip()),
        duration_s=20.0 if args.smoke else args.duration,
        policies=SMOKE_POLICIES if args.smoke else tuple(POLICIES),
    )
    trace = load_trace(TraceKind.MOONCAKE)
    places = read_places(data_dir() / CITIES_FILE)
    # A smoke run (make bench) must not overwrite the real report.
    out = args.out if args.out is not None else (None if args.smoke else Path("reports"))
    rows = run_bench(config, trace, places, out_dir=out)
    for load, summaries in rows.items():
        print(f"\nload {load:.0%}\n{table(summaries)}\n")
        print("\n".join(targets(summaries, load)))


if __name__ == "__main__":
    main()

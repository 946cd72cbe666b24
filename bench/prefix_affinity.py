"""Prefix-cache affinity in the fleet simulator: gtm against the llm-d-like and SGLang-like
baselines, with its placement memories and without (issue 22, item 3).

    python bench/prefix_affinity.py             # 120 GPUs, 60 simulated s, 85 % and 120 %
    python bench/prefix_affinity.py --smoke     # 24 GPUs, 15 simulated s
    python bench/prefix_affinity.py --gpus 240 --duration 120 --load 0.85,1.2 --seeds 0,1

Every policy replays the same Mooncake conversation trace (``hash_ids`` are real shared
prefixes) on the same fleet (:mod:`fleetsim.bench`). Per load and seed it prints each
policy's prefix-hit share (cached prompt tokens ÷ prompt tokens, at the GPUs), goodput
(requests/s within the SLO, ``fleetsim.metrics``) and p99 TTFT, then gtm's ratios
against the baselines measured in the same run and the targets:

* goodput ≥ every baseline's (``llm-d-blend``, ``sglang-cache-aware``);
* prefix-hit share ≥ 0.9 × the best baseline's.

``gtm-no-affinity`` is gtm without its placement memories and sticky rules (each tier
chooses again for a repeat, as before them): the figures before and after, in one run.
Simulated figures do not depend on the machine's load. The same comparison on a live
``gtm up --processes`` deployment: ``bench/prefix_affinity_live.py``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Protocol

from fleetsim.bench import BenchConfig, run_bench
from fleetsim.geography import CITIES_FILE, read_places
from fleetsim.traces import TraceKind, data_dir, load_trace

OURS = "gtm"
BEFORE = "gtm-no-affinity"
BASELINES = ("llm-d-blend", "sglang-cache-aware")
#: gtm's prefix-hit share must be at least this share of the best baseline's.
HIT_TARGET = 0.9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run (24 GPUs, 15 s)")
    parser.add_argument("--gpus", type=int, default=120)
    parser.add_argument("--duration", type=float, default=60.0, help="simulated seconds")
    parser.add_argument("--load", default="0.85,1.2", help="comma-separated loads")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    args = parser.parse_args()
    trace = load_trace(TraceKind.MOONCAKE)
    places = read_places(data_dir() / CITIES_FILE)
    loads = tuple(float(x) for x in args.load.split(",") if x.strip())
    missed = 0
    for seed in (int(x) for x in args.seeds.split(",") if x.strip()):
        config = BenchConfig(
            gpus=24 if args.smoke else args.gpus,
            loads=loads,
            duration_s=15.0 if args.smoke else args.duration,
            policies=(OURS, BEFORE, *BASELINES),
            seed=seed,
        )
        rows = run_bench(config, trace, places, echo=lambda _: None)
        sys.stderr.write("\r\033[K")
        for load, summaries in rows.items():
            print(f"\nseed {seed}, load {load:.0%} ({config.gpus} GPUs, {config.duration_s:g} s)")
            print(table(summaries))
            lines, ok = verdicts(summaries)
            print("\n".join(lines))
            missed += not ok
    return 0 if missed == 0 or args.smoke else 1


class Figures(Protocol):
    """What the table and the verdicts read of a policy's run: a simulated
    :class:`~fleetsim.metrics.Summary`, or a live run's figures
    (``bench/prefix_affinity_live.py``)."""

    @property
    def policy(self) -> str: ...
    @property
    def prefix_hit(self) -> float: ...
    @property
    def goodput_rps(self) -> float: ...
    @property
    def ttft_p99(self) -> float: ...
    @property
    def refused(self) -> int: ...
    @property
    def timed_out(self) -> int: ...


def table(rows: Sequence[Figures]) -> str:
    out = [
        "| policy | prefix hit | goodput req/s | TTFT p99 s | refused | timed out |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p99 = "timeout" if math.isinf(r.ttft_p99) else f"{r.ttft_p99:.2f}"
        out.append(
            f"| {r.policy} | {r.prefix_hit:.1%} | {r.goodput_rps:.1f} | {p99} | "
            f"{r.refused:,} | {r.timed_out:,} |"
        )
    return "\n".join(out)


def verdicts(rows: Sequence[Figures]) -> tuple[list[str], bool]:
    """gtm's ratios against the baselines of the same run, and whether the targets hold."""
    by = {r.policy: r for r in rows}
    ours = by[OURS]
    lines: list[str] = []
    ok = True
    for name in BASELINES:
        base = by[name]
        ratio = ours.goodput_rps / base.goodput_rps if base.goodput_rps > 0 else math.inf
        met = ours.goodput_rps >= base.goodput_rps
        ok &= met
        lines.append(f"- {_mark(met)} goodput / {name}'s: {ratio:.2f} (target ≥ 1.00)")
        if base.ttft_p99 > 0 and math.isfinite(base.ttft_p99):
            lines.append(f"-   p99 TTFT / {name}'s: {ours.ttft_p99 / base.ttft_p99:.2f}")
    best = max((by[name] for name in BASELINES), key=lambda r: r.prefix_hit)
    share = ours.prefix_hit / best.prefix_hit if best.prefix_hit > 0 else math.inf
    met = share >= HIT_TARGET
    ok &= met
    lines.append(
        f"- {_mark(met)} prefix hit / best baseline's ({best.policy}): {share:.2f} "
        f"(target ≥ {HIT_TARGET:.2f})"
    )
    before = by.get(BEFORE)
    if before is not None:
        lines.append(
            f"- before → after (gtm-no-affinity → gtm): prefix hit {before.prefix_hit:.1%} → "
            f"{ours.prefix_hit:.1%}, goodput {before.goodput_rps:.1f} → {ours.goodput_rps:.1f}"
        )
    return lines, ok


def _mark(met: bool) -> str:
    return "met" if met else "**MISSED**"


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark report: a Markdown table per load, targets, and plots (matplotlib,
optional extra ``report``) written to a directory (``reports/`` by default)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fleetsim.metrics import Summary
from fleetsim.results import RunResult, Status
from gtm.extras import Extra, install_line, optional

COLUMNS = (
    ("policy", "policy", "{}"),
    ("TTFT p50 s", "ttft_p50", "{:.2f}"),
    ("p90", "ttft_p90", "{:.2f}"),
    ("p99", "ttft_p99", "{:.2f}"),
    ("TPOT p50 ms", "tpot_p50", "{:.0f}"),
    ("E2E p50 s", "e2e_p50", "{:.1f}"),
    ("goodput req/s", "goodput_rps", "{:.1f}"),
    ("in SLO", "slo_fraction", "{:.0%}"),
    ("out tok/s", "output_tps", "{:,.0f}"),
    ("GPU busy", "gpu_busy", "{:.0%}"),
    ("capacity used", "capacity_used", "{:.0%}"),
    ("prefix hit", "prefix_hit", "{:.0%}"),
    ("cross-region", "cross_region", "{:.1%}"),
    ("spills", "spills", "{}"),
    ("refused", "refused", "{}"),
    ("timed out", "timed_out", "{}"),
    ("failed", "failed", "{}"),
    ("residency viol.", "violations", "{}"),
    ("Jain", "jain", "{:.2f}"),
    ("cost $", "cost_usd", "{:,.0f}"),
    ("sim req/s", "sim_rps", "{:,.0f}"),
)


def table(rows: Sequence[Summary]) -> str:
    head = "| " + " | ".join(c[0] for c in COLUMNS) + " |"
    sep = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|"
    lines = [head, sep]
    for row in rows:
        cells = []
        for _, attr, fmt in COLUMNS:
            value = getattr(row, attr)
            if attr == "tpot_p50":
                value = value * 1000
            if isinstance(value, float) and math.isnan(value):
                cells.append("n/a")
            elif isinstance(value, float) and math.isinf(value):
                cells.append("timeout")
            else:
                cells.append(fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Offered load at or above which the fleet counts as saturated (utilisation target).
SATURATION_LOAD = 1.0


def targets(rows: Sequence[Summary], load: float | None = None) -> list[str]:
    """The issue's quality bars, each with met / MISSED (``load``: the rows' load)."""
    by = {r.policy: r for r in rows}
    ours = by.get("gtm")
    if ours is None:
        return []
    out = []

    def line(ok: bool, text: str) -> None:
        out.append(f"- {'met' if ok else '**MISSED**'}: {text}")

    rr = by.get("round-robin")
    if rr is not None:
        line(
            ours.ttft_p99 <= 0.5 * rr.ttft_p99,
            f"gtm p99 TTFT {ours.ttft_p99:.2f} s ≤ 0.5 × round robin's {rr.ttft_p99:.2f} s",
        )
    # Baselines only: gtm's own ablations (gtm-no-ledger) are not "the best baseline".
    others = [r for r in rows if not r.policy.startswith("gtm") and not math.isnan(r.ttft_p99)]
    if others:
        best = min(others, key=lambda r: r.ttft_p99)
        line(
            ours.ttft_p99 <= 0.8 * best.ttft_p99,
            f"gtm p99 TTFT ≤ 0.8 × the best baseline's ({best.policy}, {best.ttft_p99:.2f} s)",
        )
    lc = by.get("least-connections")
    if lc is not None:
        line(
            ours.goodput_rps >= 1.2 * lc.goodput_rps,
            f"gtm goodput {ours.goodput_rps:.1f} ≥ 1.2 × least connections' "
            f"{lc.goodput_rps:.1f} req/s",
        )
    line(ours.violations == 0, f"gtm residency violations: {ours.violations}")
    if load is not None and load >= SATURATION_LOAD:
        line(
            ours.capacity_used >= 0.9,
            f"gtm GPU utilisation (capacity used) {ours.capacity_used:.0%} ≥ 90 % at "
            f"saturation (load {load:.0%}; GPU busy {ours.gpu_busy:.0%})",
        )
    line(
        ours.sim_rps >= 5000,
        f"simulated requests per wall second (gtm, all three tiers in the loop): "
        f"{ours.sim_rps:,.0f} (target 5,000)",
    )
    return out


def write_report(
    directory: Path,
    title: str,
    per_load: Mapping[float, Sequence[Summary]],
    results: Mapping[float, Sequence[RunResult]],
    preamble: str = "",
    extra: Sequence[str] = (),
    name: str = "routing",
) -> Path:
    """``directory/<name>.md`` and its plots (``routing``: ``ttft_cdf.png``, …; any other
    name prefixes the plots with it, so ``gtm sim`` does not overwrite the benchmark's)."""
    directory.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", "", preamble, ""]
    for load, rows in per_load.items():
        parts += [f"## Load {load:.0%}", "", table(rows), "", "Targets:", ""]
        parts += [*targets(rows, load), ""]
    parts += [*extra]
    plots = _plots(directory, per_load, results, "" if name == "routing" else f"{name}-")
    parts += [f"![{p.stem}]({p.name})" for p in plots]
    if not plots:
        parts += [f"No plots: matplotlib is not installed ({install_line(Extra.REPORT)})."]
    path = directory / f"{name}.md"
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def _plots(
    directory: Path,
    per_load: Mapping[float, Sequence[Summary]],
    results: Mapping[float, Sequence[RunResult]],
    prefix: str = "",
) -> list[Path]:
    matplotlib = optional("matplotlib")
    if matplotlib is None:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[Path] = []
    top = max(results)
    fig, ax = plt.subplots(figsize=(7, 4))
    for res in results[top]:
        o = res.outcomes
        # Over every request not refused: the curve stops below 1 by the share that
        # never got a first token.
        asked = int((o.status != Status.REFUSED).sum())
        ttft = np.sort(o.ttft_s[o.status == Status.OK])
        if len(ttft) and asked:
            ax.plot(ttft, np.arange(1, len(ttft) + 1) / asked, label=res.policy)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("CDF")
    ax.set_title(f"TTFT CDF at load {top:.0%}")
    ax.legend(fontsize=6)
    out.append(_save(fig, directory / f"{prefix}ttft_cdf.png"))
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r.policy for r in next(iter(per_load.values()))]
    loads = sorted(per_load)
    for name in names:
        ax.plot(
            loads,
            [next(r.goodput_rps for r in per_load[x] if r.policy == name) for x in loads],
            marker="o",
            label=name,
        )
    ax.set_xlabel("offered load")
    ax.set_ylabel("goodput (req/s in SLO)")
    ax.legend(fontsize=6)
    out.append(_save(fig, directory / f"{prefix}goodput_vs_load.png"))
    gtm = next((r for r in results[top] if r.policy == "gtm"), results[top][0])
    if gtm.util_timeline:
        fig, ax = plt.subplots(figsize=(7, 3))
        grid = np.array([u for _, u in gtm.util_timeline]).T
        ax.imshow(grid, aspect="auto", vmin=0, vmax=1, cmap="viridis")
        ax.set_ylabel("region")
        ax.set_xlabel("simulated s")
        ax.set_title(f"{gtm.policy}: GPU busy fraction per region")
        out.append(_save(fig, directory / f"{prefix}utilisation_heatmap.png"))
    return out


def _save(fig: object, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(fig)  # type: ignore[arg-type]
    return path

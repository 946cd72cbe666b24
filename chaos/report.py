"""The game-day report: ``journal.json``, ``summary.md`` and ``timeline.png``.

Shape (after the Chaos Toolkit journal, AWS
Well-Architected REL12-BP05 and the Google SRE postmortem): header with environment and
versions; hypothesis and method as replayable fault specs; a UTC timeline (phases,
injections, rollbacks, each change of a DNS answer); each criterion with its measured
value, tolerance and PASS/FAIL; requests lost and retried; residency violations.
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from chaos.journal import FaultAction, Journal, RunStatus
from chaos.probes import Measurement, ResidencyViolations, request_counts
from chaos.scenario import Scenario
from gtm._version import __version__
from gtm.errors import GtmError
from gtm.extras import Extra, install_line, optional
from gtm.state.etcd_server import find_etcd_binary
from gtm.stats import percentile
from gtmctl.load import is_stream_break

#: Width of the timeline plot's buckets, s.
BUCKET_S = 1.0


@dataclass(frozen=True, slots=True)
class Environment:
    gtm: str
    commit: str
    python: str
    etcd: str
    os: str
    deployment: str


def _run(argv: Sequence[str], cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=10, cwd=cwd, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def collect_environment(deployment: str) -> Environment:
    """Versions of what ran (the commit when the source is a git checkout)."""
    here = Path(__file__).resolve().parent
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here) or "unknown"
    if commit != "unknown" and _run(["git", "status", "--porcelain", "--", "."], cwd=here):
        commit += " (with local changes)"
    try:
        etcd_line = _run([str(find_etcd_binary()), "--version"]).splitlines()
        etcd = etcd_line[0].removeprefix("etcd Version: ") if etcd_line else "unknown"
    except GtmError:
        etcd = "not found"
    return Environment(
        gtm=__version__,
        commit=commit,
        python=platform.python_version(),
        etcd=etcd,
        os=f"{platform.system()} {platform.release()} ({platform.machine()})",
        deployment=deployment,
    )


def verdict(status: RunStatus, results: Sequence[Measurement]) -> bool:
    return status is RunStatus.COMPLETED and all(m.passed for m in results)


# ---------------------------------------------------------------------------- Markdown


def _timeline(journal: Journal) -> list[str]:
    """(time, line) rows: phases, faults, notes, and each change of a DNS answer."""
    rows: list[tuple[float, str]] = []
    rows += [(p.at, f"phase **{p.phase.value}**") for p in journal.phases]
    for f in journal.faults:
        verb = "inject" if f.action is FaultAction.INJECT else "rollback"
        error = f" — **error**: {f.error}" if f.error else ""
        rows.append((f.at, f"{verb} `{f.step}` ({f.kind}): {f.description}{error}"))
    rows += [(n.at, n.text) for n in journal.notes]
    previous: dict[str, tuple[str, tuple[str, ...]]] = {}
    for d in journal.dns:
        state = (d.rcode, d.regions)
        if previous.get(d.name) != state:
            answer = ", ".join(d.regions) or "no address"
            before = previous.get(d.name)
            was = f" (was {', '.join(before[1]) or 'no address'})" if before else ""
            rows.append((d.at, f"DNS `{d.name}` → {d.rcode} {answer}{was}"))
            previous[d.name] = state
    rows.sort(key=lambda r: r[0])
    return [f"| {journal.utc(at)} | {at:7.2f} | {text} |" for at, text in rows]


def _fmt_ms(value: float) -> str:
    return "–" if math.isnan(value) else f"{1000 * value:.0f} ms"


def render_summary(
    scenario: Scenario,
    source: str,
    journal: Journal,
    results: Sequence[Measurement],
    status: RunStatus,
    environment: Environment,
    *,
    plot: str | None,
) -> str:
    passed = verdict(status, results)
    total, lost, retried = request_counts(journal)
    attempts = sum(r.attempts for r in journal.requests)
    residency = [
        m
        for p, m in zip(scenario.hypothesis, results, strict=True)
        if isinstance(p, ResidencyViolations)
    ]
    ok = [r for r in journal.requests if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    regions = Counter(r.region for r in ok if r.region)
    failures = Counter(f"{r.status} {r.reason}".strip() for r in journal.requests if not r.ok)
    cut = Counter(r.reason for r in journal.requests if not r.ok and is_stream_break(r.reason))
    end = journal.ended_at or 0.0
    lines = [
        f"# Game day: {scenario.title}",
        "",
        f"**Result: {'PASS' if passed else 'FAIL'}** — run {status.value}, "
        f"deviated: {'no' if all(m.passed for m in results) else 'yes'}",
        "",
        f"- Scenario file: `{source}`",
        f"- Window: {journal.utc(0.0)} → {journal.utc(end)} ({end:.1f} s)",
        f"- gtm {environment.gtm}, commit {environment.commit}; Python {environment.python}; "
        f"etcd {environment.etcd}; {environment.os}",
        f"- Deployment: {environment.deployment}",
        "",
    ]
    if scenario.description.strip():
        lines += [scenario.description.strip(), ""]
    lines += [
        "## Results",
        "",
        "| Criterion | Measured | Tolerance | Result | Samples | Detail |",
        "|---|---|---|---|---|---|",
    ]
    for m in results:
        lines.append(
            f"| {m.name} | {m.value_text()} | {m.tolerance} | "
            f"{'PASS' if m.passed else '**FAIL**'} | {m.samples} | {m.detail} |"
        )
    lines += [
        "",
        "## Requests",
        "",
        f"- {total} requests, {len(ok)} succeeded, **{lost} lost** (failed after every "
        f"attempt), {retried} retried ({attempts - total} extra attempts, retry ratio "
        f"{(attempts - total) / total if total else 0:.3f})",
        f"- TTFT p50 {_fmt_ms(percentile(ttfts, 0.5))}, p99 {_fmt_ms(percentile(ttfts, 0.99))}",
        "- Served by region: "
        + (", ".join(f"{r} {n}" for r, n in regions.most_common()) or "none"),
        "- Failures: " + (", ".join(f"{k} ×{n}" for k, n in failures.most_common()) or "none"),
        f"- Cut streams (broke after the first byte): {sum(cut.values())}"
        + (" (" + ", ".join(f"{k} ×{n}" for k, n in cut.most_common()) + ")" if cut else ""),
        "- Residency violations: "
        + (
            ", ".join(f"{m.value_text()} ({m.detail})" for m in residency)
            if residency
            else "not audited by this scenario"
        ),
        "",
        "## Method (replayable fault specs)",
        "",
    ]
    for step in scenario.steps():
        until = f" for {step.duration_s:g} s" if step.duration_s else " until the method ends"
        spec = json.dumps(step.spec_json(), sort_keys=True)
        lines.append(f"- `{step.id}` at {step.at_s:g} s{until}: `{spec}`")
    lines += [
        "",
        "## Timeline (UTC)",
        "",
        "| UTC | t (s) | Event |",
        "|---|---|---|",
        *_timeline(journal),
        "",
    ]
    if plot is not None:
        lines += [f"![timeline]({plot})", ""]
    else:
        missing = install_line(Extra.REPORT)
        lines += [f"No timeline plot: matplotlib is not installed ({missing}).", ""]
    lines += [
        "Every event (each request, DNS answer, fault) is in `journal.json`; the "
        "deployment's logs and audit trail are artifacts too (see Deployment above).",
        "",
        "## Review (fill in after the game day, blameless)",
        "",
        "- What surprised us / what went well / where we got lucky:",
        "- Action items (owner, severity, ticket, re-test date):",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the plot


@dataclass(frozen=True, slots=True)
class Series:
    """Per-bucket series of the timeline plot (pure; tested without matplotlib)."""

    t: list[float]
    success: list[float | None]
    p50_ms: list[float | None]
    p99_ms: list[float | None]
    per_region: dict[str, list[float]]


def series(journal: Journal, bucket_s: float = BUCKET_S) -> Series:
    end = max(
        [journal.ended_at or 0.0, *(r.sent_at for r in journal.requests)],
    )
    count = max(1, int(end // bucket_s) + 1)
    buckets: list[list[int]] = [[] for _ in range(count)]
    for index, record in enumerate(journal.requests):
        buckets[min(count - 1, int(record.sent_at // bucket_s))].append(index)
    regions = sorted({r.region for r in journal.requests if r.ok and r.region})
    per_region: dict[str, list[float]] = defaultdict(lambda: [0.0] * count)
    success: list[float | None] = []
    p50: list[float | None] = []
    p99: list[float | None] = []
    for b, members in enumerate(buckets):
        records = [journal.requests[i] for i in members]
        success.append(sum(r.ok for r in records) / len(records) if records else None)
        ttfts = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
        p50.append(1000 * percentile(ttfts, 0.5) if ttfts else None)
        p99.append(1000 * percentile(ttfts, 0.99) if ttfts else None)
        for r in records:
            if r.ok and r.region:
                per_region[r.region][b] += 1.0 / bucket_s
    return Series(
        t=[b * bucket_s for b in range(count)],
        success=success,
        p50_ms=p50,
        p99_ms=p99,
        per_region={r: per_region[r] for r in regions},
    )


def plot_timeline(journal: Journal, path: Path, title: str) -> Path | None:
    """Success rate, TTFT p50/p99 and per-region traffic, fault windows shaded; ``None``
    without matplotlib (an optional dependency: the report says which extra draws it)."""
    matplotlib = optional("matplotlib")
    if matplotlib is None:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(journal)
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    nan = float("nan")

    def values(column: list[float | None]) -> list[float]:
        return [nan if v is None else v for v in column]

    axes[0].plot(data.t, values(data.success), drawstyle="steps-post", color="tab:green")
    axes[0].set_ylabel("success rate")
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].plot(data.t, values(data.p50_ms), label="TTFT p50", color="tab:blue")
    axes[1].plot(data.t, values(data.p99_ms), label="TTFT p99", color="tab:red")
    axes[1].set_ylabel("ms")
    axes[1].legend(fontsize=7, loc="upper left")
    for region, rates in data.per_region.items():
        axes[2].plot(data.t, rates, label=region, drawstyle="steps-post")
    axes[2].set_ylabel("served req/s")
    axes[2].set_xlabel("seconds since the run started")
    if data.per_region:
        axes[2].legend(fontsize=7, loc="upper left", ncol=3)
    starts: Counter[float] = Counter()
    for step, _description, start, end in journal.fault_windows():
        for ax in axes:
            ax.axvspan(start, end, color="tab:orange", alpha=0.2)
        # Steps that start together are labelled one under the other.
        axes[0].annotate(step, (start, 0.95 - 0.1 * starts[round(start)]), fontsize=7, va="top")
        starts[round(start)] += 1
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def write_report(
    directory: Path,
    scenario: Scenario,
    source: str,
    journal: Journal,
    results: Sequence[Measurement],
    status: RunStatus,
    environment: Environment,
) -> Path:
    """Write the three files; returns the summary's path."""
    directory.mkdir(parents=True, exist_ok=True)
    header = {
        "title": scenario.title,
        "scenario": source,
        "status": status.value,
        "passed": verdict(status, results),
        "deviated": not all(m.passed for m in results),
        "environment": asdict(environment),
        "results": [asdict(m) for m in results],
    }
    (directory / "journal.json").write_text(journal.to_json(header), encoding="utf-8")
    plot = plot_timeline(journal, directory / "timeline.png", scenario.title)
    summary = render_summary(
        scenario,
        source,
        journal,
        results,
        status,
        environment,
        plot=None if plot is None else plot.name,
    )
    path = directory / "summary.md"
    path.write_text(summary, encoding="utf-8")
    return path

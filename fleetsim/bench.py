"""One side-by-side benchmark: every policy on identical arrivals, at each load.

**Load** is the offered request rate over the fleet's capacity: the requests/s the
whole fleet serves when every GPU is kept full of the trace's mean request
(:func:`~fleetsim.workload.fleet_capacity_rps`, no prefix cache). Clients are
where people live (``cities_top5000.csv``), so demand is not spread evenly over the
regions; by default (``fleet_shape="demand"``) each region gets GPUs in proportion to
the demand nearest to it, as an operator provisions, so that a nearest-region policy
is not overloaded by construction. ``"equal"`` gives every region the same share.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetsim.fleet import FleetSpec, scaled_fleet
from fleetsim.geography import Geography, Place
from fleetsim.metrics import Summary, summarise
from fleetsim.policies import POLICIES, policy
from fleetsim.report import write_report
from fleetsim.simulator import (
    CLIENT_TIMEOUT_S,
    DRAIN_S,
    FaultPlan,
    RunResult,
    Simulator,
    Status,
)
from fleetsim.traces import Trace
from fleetsim.workload import (
    SimRequest,
    build_requests,
    fleet_capacity_rps,
    fleet_capacity_tps,
    nearest_region_counts,
)
from gtm.policy_store import ActivePolicy, activate
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
    #: "demand": GPUs per region in proportion to the demand nearest to it; "equal".
    fleet_shape: str = "demand"
    #: Enforce the example tenants' quotas (scaled to the fleet) for every policy.
    quotas: bool = True
    faults: FaultPlan | None = None
    drain_s: float = DRAIN_S
    client_timeout_s: float = CLIENT_TIMEOUT_S
    #: Runs (policy × load) simulated at once in worker processes; 1: one after the
    #: other in this process, with a progress bar per run.
    jobs: int = 1
    #: Processes one run is simulated over (its regions split between them:
    #: fleetsim.partition; the outcomes are the same). For one big run; ``jobs``
    #: is the better use of cores for many small ones.
    workers: int = 1
    #: Simulated seconds between the zone agents' scrapes of their GPUs (None: no
    #: scrapes; :class:`fleetsim.simulator.Simulator` ``scrape_s``).
    scrape_s: float | None = None


@dataclass(frozen=True, slots=True)
class Setup:
    """The fleet and what the report says about it."""

    fleet: FleetSpec
    capacity_rps: float
    capacity_tps: float
    demand: tuple[int, ...]
    quota_scale: float | None


def prepare(config: BenchConfig, trace: Trace, places: tuple[Place, ...]) -> Setup:
    """Build the fleet (shaped by demand if asked) and its capacity and quota scale."""
    active = _active()
    fleet = scaled_fleet(active, config.gpus, config.regions)
    geography = Geography(places, seed=config.seed)
    capacity = fleet_capacity_rps(fleet.gpu_types(), config.model, trace, config.max_input)
    probe = build_requests(
        trace, geography, rate_rps=capacity, duration_s=config.duration_s,
        max_input=config.max_input,
    )  # fmt: skip
    demand = nearest_region_counts(probe, [r.record for r in fleet.regions])
    if config.fleet_shape == "demand" and sum(demand) > 0:
        fleet = scaled_fleet(active, config.gpus, config.regions, weights=demand)
        capacity = fleet_capacity_rps(fleet.gpu_types(), config.model, trace, config.max_input)
    scale = quota_scale(active, probe, config.duration_s) if config.quotas else None
    tps = fleet_capacity_tps(fleet.gpu_types(), config.model, trace, config.max_input)
    return Setup(fleet, capacity, tps, tuple(demand), scale)


def quota_scale(active: ActivePolicy, requests: Sequence[SimRequest], duration_s: float) -> float:
    """The factor on the example tenants' quotas that makes each tenant's tightest
    per-minute limit equal to its average demand at load 1.0 (``requests``): below
    saturation quotas bind only on bursts, above it they hold tenants to their share.
    """
    minutes = max(duration_s, 1e-9) / 60.0
    need = 1e-9
    for name in sorted({r.tenant for r in requests}):
        tenant = active.tenants.get(name)
        if tenant is None or tenant.quotas is None:
            continue
        q = tenant.quotas
        mine = [r for r in requests if r.tenant == name]
        ins = sum(r.input_tokens for r in mine)
        outs = sum(r.output_tokens for r in mine)
        per_minute = (
            (q.requests_per_minute, len(mine)),
            (q.input_tokens_per_minute, ins),
            (q.output_tokens_per_minute, outs),
            (q.weighted_tokens_per_minute, ins + q.output_weight * outs),
        )
        for limit, used in per_minute:
            if limit is not None:
                need = max(need, used / minutes / limit)
    return need


def run_bench(
    config: BenchConfig,
    trace: Trace,
    places: tuple[Place, ...],
    *,
    out_dir: Path | None = None,
    echo: Callable[[str], None] = print,
    report_name: str = "routing",
) -> dict[float, list[Summary]]:
    active = _active()
    setup = prepare(config, trace, places)
    fleet, capacity = setup.fleet, setup.capacity_rps
    geography = Geography(places, seed=config.seed)
    echo(_fleet_line(config, setup))
    workloads: dict[float, Sequence[SimRequest]] = {}
    for load in config.loads:
        workloads[load] = build_requests(
            trace, geography, rate_rps=load * capacity, duration_s=config.duration_s,
            max_input=config.max_input,
        )  # fmt: skip
    context = _Context(config, fleet, active, setup, workloads)
    runs_of = _runs_in_order(context, config.jobs)
    per_load: dict[float, list[Summary]] = {}
    results: dict[float, list[RunResult]] = {}
    started = time.perf_counter()
    simulated = 0
    for load in config.loads:
        requests = workloads[load]
        echo(
            f"load {load:.0%}: {len(requests):,} requests over {config.duration_s:g} simulated s "
            f"({load * capacity:,.1f} req/s; capacity ≈ {capacity:,.1f} req/s)"
        )
        rows, runs = [], []
        for name in config.policies:
            result, summary, wall = next(runs_of)
            sys.stderr.write("\r\033[K")
            echo(
                f"  {name:<26} TTFT p50 {_secs(summary.ttft_p50)}  p99 {_secs(summary.ttft_p99)}"
                f"  goodput {summary.goodput_rps:7.1f} req/s  capacity used "
                f"{summary.capacity_used:4.0%}  busy {summary.gpu_busy:4.0%}"
                f"  refused {summary.refused:,}  timed out {summary.timed_out:,}"
                f"  {summary.sim_rps:,.0f} simulated req/s"
                f" ({wall:.1f} s wall)"
            )
            rows.append(summary)
            runs.append(result)
            simulated += len(requests)
        per_load[load] = rows
        results[load] = runs
    elapsed = time.perf_counter() - started
    echo(
        f"{simulated:,} simulated requests in {elapsed:.1f} s wall: "
        f"{simulated / max(elapsed, 1e-9):,.0f} simulated req/s over the machine "
        f"({config.jobs} job{'s' if config.jobs > 1 else ''})"
    )
    if out_dir is not None:
        path = write_report(
            out_dir,
            "Routing benchmark",
            per_load,
            results,
            preamble=_preamble(config, trace, setup),
            extra=_reasons(results),
            name=report_name,
        )
        echo(f"report: {path}")
    return per_load


@dataclass(frozen=True, slots=True)
class _Context:
    """What every run of one benchmark shares (handed to worker processes by fork)."""

    config: BenchConfig
    fleet: FleetSpec
    active: ActivePolicy
    setup: Setup
    workloads: Mapping[float, Sequence[SimRequest]]


#: A worker process's context, set once by :func:`_adopt` when the pool forks it.
_WORKER: list[_Context] = []


def _simulate(
    context: _Context, load: float, name: str, *, bars: bool
) -> tuple[RunResult, Summary, float]:
    """One policy at one load: the run, its figures, its wall seconds."""
    config, requests = context.config, context.workloads[load]
    started = time.perf_counter()
    spec = policy(name)
    sim = Simulator(
        context.fleet, context.active, spec, requests, model=config.model, ledger=spec.ledger,
        duration_s=config.duration_s,
        progress=_progress(name, config, len(requests)) if bars else None,
        seed=config.seed, drain_s=config.drain_s, client_timeout_s=config.client_timeout_s,
        quota_scale=context.setup.quota_scale, faults=config.faults, workers=config.workers,
        scrape_s=config.scrape_s,
    )  # fmt: skip
    result = sim.run()
    summary = summarise(result, list(requests), context.setup.capacity_tps)
    return result, summary, time.perf_counter() - started


def _adopt(context: _Context) -> None:
    _WORKER[:] = [context]


def _work(job: tuple[float, str]) -> tuple[RunResult, Summary, float]:
    return _simulate(_WORKER[0], *job, bars=False)


def _runs_in_order(context: _Context, jobs: int) -> Iterator[tuple[RunResult, Summary, float]]:
    """Every (load, policy) run in report order: here one by one, or in ``jobs`` worker
    processes (forked: the workload and fleet are not copied; each run is the same
    deterministic simulation wherever it runs, so the results are those of one process).
    """
    order = [(load, name) for load in context.config.loads for name in context.config.policies]
    if jobs <= 1 or len(order) <= 1:
        for load, name in order:
            yield _simulate(context, load, name, bars=True)
        return
    with multiprocessing.get_context("fork").Pool(
        min(jobs, len(order)), initializer=_adopt, initargs=(context,)
    ) as pool:
        yield from pool.imap(_work, order)


def _secs(value: float) -> str:
    return "timeout" if math.isinf(value) else f"{value:6.2f} s"


def _active() -> ActivePolicy:
    return activate(1, load_examples())


def _fleet_line(config: BenchConfig, setup: Setup) -> str:
    per_region = ", ".join(
        f"{r.id} {sum(len(z.gpus) for z in r.zones)}" for r in setup.fleet.regions
    )
    return (
        f"fleet {setup.fleet.gpu_count} GPUs ({config.fleet_shape}-shaped: {per_region}); "
        f"capacity ≈ {setup.capacity_rps:,.1f} req/s"
    )


def _preamble(config: BenchConfig, trace: Trace, setup: Setup) -> str:
    fleet = setup.fleet
    total = max(1, sum(setup.demand))
    rows = [
        "| region | GPUs | share of GPUs | share of clients nearest |",
        "|---|---:|---:|---:|",
    ]
    for region, nearest in zip(fleet.regions, setup.demand, strict=False):
        count = sum(len(z.gpus) for z in region.zones)
        rows.append(
            f"| {region.id} | {count} | {count / fleet.gpu_count:.0%} | {nearest / total:.0%} |"
        )
    faults = config.faults or FaultPlan()
    fault_text = (
        f" Faults: {faults.crash_fraction:.0%} of the GPUs crash at {faults.crash_at_s:g} s "
        f"(detected {faults.detect_s:g} s later), {faults.slow_fraction:.0%} run "
        f"{faults.slowdown:g}× slower."
        if faults.any
        else ""
    )
    quota = (
        f"Quotas: the example tenants' limits × {setup.quota_scale:,.1f} (each tenant's "
        "tightest per-minute limit = its mean demand at load 100 %), enforced by "
        "`regional_lb.quota` for every policy alike: in gtm's regional tier, and for a "
        "baseline at the region it picked (the API gateway, e.g. LiteLLM or Envoy AI "
        "Gateway per-tenant limits, in front of its balancer)."
        if setup.quota_scale is not None
        else "Quotas: off."
    )
    return "\n".join(
        [
            f"Trace `{trace.source}` ({trace.kind.value}); {fleet.gpu_count} GPUs in "
            f"{len(fleet.regions)} regions ({config.fleet_shape}-shaped); model "
            f"{config.model}; {config.duration_s:g} simulated s of arrivals per run, then up "
            f"to {config.drain_s:g} s to finish; seed {config.seed}. Simulator: fleetsim "
            "(analytic GPU model, the tiers' real decision code); zone agents "
            + (
                f"scrape their GPUs every {config.scrape_s:g} s."
                if config.scrape_s is not None
                else "decide on their own in-flight charges (no scrapes)."
            ),
            "",
            f"Load = offered req/s ÷ fleet capacity ({setup.capacity_rps:,.1f} req/s: every "
            "GPU kept full of the mean replayed request, no prefix cache). Rates and GPU busy "
            "are over the arrival window; GPU busy = share of the window a GPU had work, "
            "capacity used = tokens served/s ÷ the fleet's saturated token rate. TTFT "
            "percentiles count every request not refused; "
            "one that never got a first token (client gave up after "
            f"{config.client_timeout_s:g} s, regional queue TTL, GPU crash, horizon) is "
            'infinitely late ("timeout"). Cross-region: served outside the region nearest '
            "the client. Jain: over tenants, share of each tenant's demand (VTC units) "
            f"served within the SLO. {quota}{fault_text}",
            "",
            *rows,
        ]
    )


def _reasons(results: dict[float, list[RunResult]]) -> list[str]:
    """Why requests were not served, per load and policy (nothing hidden)."""
    lines = ["## Requests not served, by reason", ""]
    for load, runs in results.items():
        for res in runs:
            o = res.outcomes
            counts = Counter(
                o.reason[k] for k in range(o.n) if o.status[k] not in (Status.OK, Status.PENDING)
            )
            if counts:
                text = "; ".join(f"{why} {n:,}" for why, n in counts.most_common())
                lines.append(f"- load {load:.0%}, {res.policy}: {text}")
    return [*lines, ""]


def _progress(name: str, config: BenchConfig, requests: int) -> Callable[[float], None]:
    started = time.perf_counter()
    total = config.duration_s + config.drain_s

    def show(at: float) -> None:
        done = min(1.0, at / total) if total > 0 else 1.0
        bar = "#" * int(30 * done)
        wall = time.perf_counter() - started
        rate = requests * min(1.0, at / max(config.duration_s, 1e-9)) / max(wall, 1e-9)
        eta = "" if done <= 0 else f" eta {wall * (1 - done) / done:4.0f} s"
        sys.stderr.write(
            f"\r  {name:<26} [{bar:<30}] {done:4.0%} sim {at:6.0f} s  ~{rate:,.0f} req/s{eta}"
        )
        sys.stderr.flush()

    return show


__all__ = ["BenchConfig", "Setup", "prepare", "quota_scale", "run_bench"]

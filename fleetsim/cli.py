"""``gtm sim`` and ``gtm bench routing``: the fleet simulator from the command line."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import click

from fleetsim.bench import BenchConfig, run_bench
from fleetsim.geography import CITIES_FILE, read_places
from fleetsim.policies import ABLATIONS, POLICIES
from fleetsim.simulator import CLIENT_TIMEOUT_S, DRAIN_S, FaultPlan
from fleetsim.traces import TraceKind, data_dir, load_trace
from gtm import data
from gtm.errors import ConfigError


def _loads(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of numbers: {text!r}") from None
    if not values or any(not 0 < v <= 2 for v in values):
        raise click.BadParameter("loads must be in (0, 2]")
    return values


def _policies(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip()) if text else tuple(POLICIES)
    unknown = [n for n in names if n not in POLICIES and n not in ABLATIONS]
    if unknown:
        known = ", ".join([*POLICIES, *ABLATIONS])
        raise click.BadParameter(f"unknown policies {unknown}; known: {known}")
    return names


def _common(fn: click.decorators.FC) -> click.decorators.FC:
    options = [
        click.option("--trace", "trace_kind", type=click.Choice([k.value for k in TraceKind]),
                     default=TraceKind.MOONCAKE.value, show_default=True,
                     help="the requests replayed (synthetic: drawn with --seed from a model "
                          "fitted on azure-conv, no file)"),
        click.option("--trace-path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="a trace file in that format, plain or .xz/.gz (default: the one "
                          "shipped with gtm, or under $GTM_DATA_DIR)"),
        click.option("--gpus", type=click.IntRange(2, 100_000), default=48, show_default=True),
        click.option("--regions", type=click.IntRange(1, 6), default=6, show_default=True),
        click.option("--duration", type=click.FloatRange(1.0), default=60.0, show_default=True,
                     help="simulated seconds of arrivals per run (then up to --drain more "
                          "to finish)"),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path),
                     default=Path("reports"), show_default=True),
        click.option("--fleet-shape", type=click.Choice(["demand", "equal"]), default="demand",
                     show_default=True,
                     help="GPUs per region: in proportion to the clients nearest to it, or "
                          "equal shares"),
        click.option("--quotas/--no-quotas", default=True, show_default=True,
                     help="enforce the example tenants' quotas (scaled to the fleet) for "
                          "every policy: in gtm's regional tier, in a per-region gateway "
                          "in front of each baseline"),
        click.option("--client-timeout", type=click.FloatRange(0.1), default=CLIENT_TIMEOUT_S,
                     show_default=True,
                     help="seconds a client waits for its first token before giving up"),
        click.option("--drain", type=click.FloatRange(0.0), default=DRAIN_S, show_default=True,
                     help="simulated seconds after the arrivals for work to finish"),
        click.option("--crash-fraction", type=click.FloatRange(0.0, 1.0), default=0.0,
                     show_default=True, help="fraction of the GPUs that crash at --crash-at"),
        click.option("--crash-at", type=click.FloatRange(0.0), default=0.0, show_default=True,
                     help="simulated second of the crash"),
        click.option("--slow-fraction", type=click.FloatRange(0.0, 1.0), default=0.0,
                     show_default=True, help="fraction of the GPUs that run --slowdown × slower"),
        click.option("--slowdown", type=click.FloatRange(1.0), default=2.0, show_default=True),
        click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
                     help="processes each run is simulated over, its regions split between "
                          "them (e.g. the number of cores, for one big run); the outcomes "
                          "are the same"),
        click.option("--scrape-interval", type=click.FloatRange(0.01), default=None,
                     help="simulated seconds between the zone agents' scrapes of their "
                          "GPUs' metrics (running, waiting, KV use), which their GPU "
                          "choice then weighs as live agents do (gtm up: 0.25); default: "
                          "no scrapes, the agents' own in-flight charges only (faster)"),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn


@dataclass(frozen=True, slots=True)
class _Options:
    """The options every simulator command shares besides fleet size and loads."""

    fleet_shape: str
    quotas: bool
    client_timeout: float
    drain: float
    crash_fraction: float
    crash_at: float
    slow_fraction: float
    slowdown: float
    workers: int
    scrape_interval: float | None

    def config(
        self, gpus: int, regions: int, loads: tuple[float, ...], duration: float,
        names: tuple[str, ...], seed: int,
    ) -> BenchConfig:  # fmt: skip
        faults = FaultPlan(
            crash_fraction=self.crash_fraction, crash_at_s=self.crash_at,
            slow_fraction=self.slow_fraction, slowdown=self.slowdown,
        )  # fmt: skip
        return BenchConfig(
            gpus, regions, loads, duration, names, seed=seed, fleet_shape=self.fleet_shape,
            quotas=self.quotas, faults=faults if faults.any else None, drain_s=self.drain,
            client_timeout_s=self.client_timeout, workers=self.workers,
            scrape_s=self.scrape_interval,
        )  # fmt: skip


def _run(
    trace_kind: str, trace_path: Path | None, config: BenchConfig, out: Path, name: str
) -> None:
    try:
        trace = load_trace(TraceKind(trace_kind), trace_path, seed=config.seed)
        try:
            places = read_places(data_dir() / CITIES_FILE)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (data folder: {data.origin()})") from None
        run_bench(config, trace, places, out_dir=out, echo=click.echo, report_name=name)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.command("sim")
@_common
@click.option("--load", type=click.FloatRange(0.01, 2.0), default=0.85, show_default=True,
              help="offered req/s ÷ the fleet's capacity")  # fmt: skip
@click.option("--policy", "policy_names", default="gtm", show_default=True,
              help="comma-separated policies")  # fmt: skip
def sim(
    trace_kind: str, trace_path: Path | None, gpus: int, regions: int, duration: float,
    seed: int, out: Path, load: float, policy_names: str, fleet_shape: str, quotas: bool,
    client_timeout: float, drain: float, crash_fraction: float, crash_at: float,
    slow_fraction: float, slowdown: float, workers: int, scrape_interval: float | None,
) -> None:  # fmt: skip
    """Run the discrete-event fleet simulator for one load; print its figures
    (simulated requests per wall second included) and write OUT/sim.md."""
    options = _Options(
        fleet_shape, quotas, client_timeout, drain, crash_fraction, crash_at, slow_fraction,
        slowdown, workers, scrape_interval,
    )  # fmt: skip
    config = options.config(gpus, regions, (load,), duration, _policies(policy_names), seed)
    _run(trace_kind, trace_path, config, out, "sim")


@click.group("bench")
def bench() -> None:
    """Side-by-side benchmarks."""


@bench.command("routing")
@_common
@click.option("--load", "loads", default="0.5,0.7,0.85,0.95", show_default=True,
              help="comma-separated offered loads (req/s ÷ the fleet's capacity)")  # fmt: skip
@click.option("--policies", "policy_names", default="",
              help="comma-separated (default: gtm and every baseline; ablations of gtm, "
                   "on request: " + ", ".join(ABLATIONS) + ")")  # fmt: skip
@click.option("--jobs", type=click.IntRange(1, 256), default=1, show_default=True,
              help="runs (policy × load) simulated at once in worker processes, e.g. the "
                   "number of cores; the results are the same")  # fmt: skip
def routing(
    trace_kind: str, trace_path: Path | None, gpus: int, regions: int, duration: float,
    seed: int, out: Path, loads: str, policy_names: str, jobs: int, fleet_shape: str,
    quotas: bool, client_timeout: float, drain: float, crash_fraction: float, crash_at: float,
    slow_fraction: float, slowdown: float, workers: int, scrape_interval: float | None,
) -> None:  # fmt: skip
    """Every policy on identical arrivals at each load: Markdown table + plots in
    OUT/routing.md (simulated requests per wall second included)."""
    options = _Options(
        fleet_shape, quotas, client_timeout, drain, crash_fraction, crash_at, slow_fraction,
        slowdown, workers, scrape_interval,
    )  # fmt: skip
    names = _policies(policy_names)
    config = options.config(gpus, regions, _loads(loads), duration, names, seed)
    _run(trace_kind, trace_path, replace(config, jobs=jobs), out, "routing")

"""``gtm sim`` and ``gtm bench routing``: the fleet simulator from the command line."""

from __future__ import annotations

from pathlib import Path

import click

from fleetsim.sim.bench import BenchConfig, run_bench
from fleetsim.sim.policies import POLICIES
from fleetsim.traces import TraceKind, data_dir, load_trace
from fleetsim.workload import CITIES_FILE, read_places
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
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise click.BadParameter(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    return names


def _common(fn: click.decorators.FC) -> click.decorators.FC:
    options = [
        click.option("--trace", "trace_kind", type=click.Choice([k.value for k in TraceKind]),
                     default=TraceKind.MOONCAKE.value, show_default=True),
        click.option("--trace-path", type=click.Path(dir_okay=False, path_type=Path),
                     help="a trace file in that format (default: the shared data)"),
        click.option("--gpus", type=click.IntRange(2, 100_000), default=48, show_default=True),
        click.option("--regions", type=click.IntRange(1, 6), default=6, show_default=True),
        click.option("--duration", type=click.FloatRange(1.0), default=60.0, show_default=True,
                     help="simulated seconds per run"),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path),
                     default=Path("reports"), show_default=True),
    ]  # fmt: skip
    for option in reversed(options):
        fn = option(fn)
    return fn


def _run(trace_kind: str, trace_path: Path | None, config: BenchConfig, out: Path) -> None:
    try:
        trace = load_trace(TraceKind(trace_kind), trace_path)
        places = read_places(data_dir() / CITIES_FILE)
        run_bench(config, trace, places, out_dir=out, echo=click.echo)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.command("sim")
@_common
@click.option("--load", type=click.FloatRange(0.01, 2.0), default=0.85, show_default=True)
@click.option("--policy", "policy_names", default="gtm", show_default=True,
              help="comma-separated policies")  # fmt: skip
def sim(
    trace_kind: str, trace_path: Path | None, gpus: int, regions: int, duration: float,
    seed: int, out: Path, load: float, policy_names: str,
) -> None:  # fmt: skip
    """Run the discrete-event fleet simulator for one load and print its figures."""
    config = BenchConfig(gpus, regions, (load,), duration, _policies(policy_names), seed=seed)
    _run(trace_kind, trace_path, config, out)


@click.group("bench")
def bench() -> None:
    """Side-by-side benchmarks."""


@bench.command("routing")
@_common
@click.option("--load", "loads", default="0.5,0.7,0.85,0.95", show_default=True)
@click.option("--policies", "policy_names", default="", help="comma-separated (default: all)")
def routing(
    trace_kind: str, trace_path: Path | None, gpus: int, regions: int, duration: float,
    seed: int, out: Path, loads: str, policy_names: str,
) -> None:  # fmt: skip
    """Every policy on identical arrivals at each load: Markdown table + plots in --out."""
    config = BenchConfig(gpus, regions, _loads(loads), duration, _policies(policy_names), seed=seed)
    _run(trace_kind, trace_path, config, out)

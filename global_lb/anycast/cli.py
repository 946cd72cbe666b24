"""``gtm anycast``: announce this region's anycast prefixes through a BGP speaker while
its services are ready, residency allows and it is not drained.

Two speakers (:mod:`global_lb.anycast.speaker`):

* ``--speaker exabgp`` (default): ExaBGP runs this command as its process. Print a
  matching ExaBGP configuration with ``--exabgp-config`` (it runs this same command line)
  and start ``exabgp`` on it; gtm then talks on standard output / input, and logs on
  standard error.
* ``--speaker bird``: gtm writes ``--bird-include`` (static routes, and ``protocol bgp``
  sessions for the ``--neighbor`` options) and reconfigures BIRD through ``birdc``.

SIGTERM/SIGINT: withdraw everything, wait for the speaker to take it, linger, exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
from aiohttp import web
from prometheus_client import CollectorRegistry

from global_lb.anycast.controller import (
    AnycastController,
    AnycastMetrics,
    FleetSignals,
    ProbeSignals,
    region_jurisdictions,
)
from global_lb.anycast.policy import AnycastPrefix, DrainBehaviour, DrainPolicy, Service
from global_lb.anycast.speaker import (
    Attributes,
    BirdSpeaker,
    ExaBgpSpeaker,
    FileLineWriter,
    Neighbour,
    Sessions,
    Speaker,
    exabgp_config,
)
from global_lb.app import load_policy
from gtm.cli_types import StateURL
from gtm.clock import SystemClock
from gtm.envvars import from_environment
from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.policy_store import ActivePolicy
from gtm.serve import add_service_routes, serving, until_signalled
from gtm.state.snapshot import SnapshotWatcher
from gtm.state.url import open_store
from gtm.tasks import TaskSupervisor

DEFAULT_CHECK = "http://127.0.0.1:8080/readyz"

log = logging.getLogger("gtm.anycast")


class SpeakerKind:
    EXABGP = "exabgp"
    BIRD = "bird"


def _prefix(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
    try:
        return tuple(AnycastPrefix.parse(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _neighbour(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
    try:
        return tuple(Neighbour.parse(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _checks(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
    checks: dict[Service, str] = {}
    for value in values or (f"{Service.FRONT_DOOR}={DEFAULT_CHECK}",):
        name, sep, url = value.partition("=")
        try:
            checks[Service(name)] = url
        except ValueError:
            sep = ""
        if not sep or not url:
            raise click.BadParameter(f"{value!r}: expected front-door=URL or dns=URL")
    return checks


@dataclass(frozen=True, slots=True)
class _Setup:
    prefixes: tuple[AnycastPrefix, ...]
    source: ProbeSignals
    drain: DrainPolicy
    attrs: Attributes
    sessions: Sessions
    policy: ActivePolicy


@from_environment
@click.command("anycast")
@click.option("--region", required=True, help="This region's id (as in the policies).")
@click.option(
    "--prefix",
    "prefixes",
    multiple=True,
    required=True,
    callback=_prefix,
    help="PREFIX[,service=front-door|dns][,jurisdiction=ID]: an anycast prefix; one with "
    "a jurisdiction is announced only by regions inside it. Repeatable.",
)
@click.option(
    "--policies",
    multiple=True,
    type=click.Path(exists=True),
    help="Policy files/dirs the region's jurisdictions are read from (default: the "
    "shipped examples). Repeatable.",
)
@click.option(
    "--jurisdiction",
    "jurisdictions",
    multiple=True,
    help="The region's jurisdictions, instead of reading them from the policies.",
)
@click.option(
    "--check",
    "checks",
    multiple=True,
    callback=_checks,
    help=f"SERVICE=URL readiness check (200 = ready) of a local service "
    f"[default: front-door={DEFAULT_CHECK}]. Repeatable.",
)
@click.option(
    "--speaker",
    type=click.Choice([SpeakerKind.EXABGP, SpeakerKind.BIRD]),
    default=SpeakerKind.EXABGP,
    show_default=True,
)
@click.option("--local-as", type=click.IntRange(1, 4294967295), required=True)
@click.option(
    "--neighbor",
    "neighbours",
    multiple=True,
    callback=_neighbour,
    help="ADDRESS,AS[,LOCAL_ADDRESS] of a BGP neighbour (the ExaBGP configuration; BIRD "
    "sessions written into the include). Repeatable.",
)
@click.option("--hold-time", type=click.IntRange(3, 65535), default=3, show_default=True)
@click.option("--bfd", is_flag=True, help="BIRD sessions with BFD (bird.conf needs protocol bfd).")
@click.option(
    "--drain",
    "drain_behaviour",
    type=click.Choice([b.value for b in DrainBehaviour]),
    default=DrainBehaviour.PREPEND.value,
    show_default=True,
    help="How a drained region leaves: AS-path prepend or lower local-pref (then withdraw "
    "after --drain-grace), or withdraw at once.",
)
@click.option(
    "--drain-grace",
    type=click.FloatRange(0),
    default=60.0,
    show_default=True,
    help="Seconds announced-draining before withdrawing (0: stay the last resort).",
)
@click.option("--drain-prepend", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--drain-local-pref", type=click.IntRange(0, 4294967295), default=50)
@click.option(
    "--state",
    type=StateURL(),
    default=None,
    help="etcd://HOST:PORT[,...]: follow the fleet as the global tier does — this "
    "region's drain (gtm drain region ID), which jurisdictions have an available region; "
    "through an outage the last snapshot stays (none by default).",
)
@click.option(
    "--require-summaries",
    is_flag=True,
    help="As gtm global's: a region without a published summary counts as down.",
)
@click.option(
    "--drain-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="While this file exists the region is drained (its mtime: when the drain began).",
)
@click.option("--interval", type=click.FloatRange(0.05, 60), default=0.2, show_default=True)
@click.option("--rise", type=click.IntRange(1, 100), default=2, show_default=True)
@click.option("--fall", type=click.IntRange(1, 100), default=2, show_default=True)
@click.option(
    "--linger",
    type=click.FloatRange(0, 600),
    default=1.0,
    show_default=True,
    help="Seconds to wait after the speaker took the withdrawal on SIGTERM.",
)
@click.option(
    "--metrics-listen",
    default=None,
    help="HOST:PORT for /metrics, /healthz and /api/v1/anycast (none by default).",
)
@click.option(
    "--bird-include",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("/etc/bird/gtm-anycast.conf"),
    show_default=True,
)
@click.option("--bird-socket", type=click.Path(path_type=Path), default=None)
@click.option("--birdc", default="birdc", show_default=True)
@click.option(
    "--exabgp-config",
    is_flag=True,
    help="Print an ExaBGP configuration that runs this command and exit.",
)
@click.option("--router-id", default=None, help="ExaBGP router id (--exabgp-config).")
@click.option("--local-address", default=None, help="ExaBGP local address (--exabgp-config).")
def anycast(**options: Any) -> None:
    """Announce this region's anycast prefixes while it can serve them."""
    setup = _setup(options)
    if options["exabgp_config"]:
        click.echo(_exabgp_config(options, setup), nl=False)
        return
    asyncio.run(_run(options, setup))


def _setup(options: dict[str, Any]) -> _Setup:
    region: str = options["region"]
    policy = load_policy(tuple(options["policies"]))
    if options["jurisdictions"]:
        jurisdictions = frozenset(options["jurisdictions"])
    else:
        try:
            jurisdictions = region_jurisdictions(policy, region)
        except KeyError as exc:
            raise ConfigError(str(exc.args[0])) from None
    drain = DrainPolicy(
        behaviour=DrainBehaviour(options["drain_behaviour"]),
        grace_s=options["drain_grace"] or None,
        prepend=options["drain_prepend"],
        local_pref=options["drain_local_pref"],
    )
    source = ProbeSignals(
        region,
        jurisdictions,
        options["checks"],
        drain_file=options["drain_file"],
        rise=options["rise"],
        fall=options["fall"],
    )
    sessions = Sessions(options["neighbours"], options["hold_time"], options["bfd"])
    attrs = Attributes(options["local_as"], drain)
    return _Setup(options["prefixes"], source, drain, attrs, sessions, policy)


def _exabgp_config(options: dict[str, Any], setup: _Setup) -> str:
    neighbours = setup.sessions.neighbours
    if not neighbours:
        raise ConfigError("--exabgp-config needs --neighbor")
    local = options["local_address"]
    if local is None and any(n.local is None for n in neighbours):
        raise ConfigError("--exabgp-config needs --local-address or ADDRESS,AS,LOCAL neighbours")
    router_id = options["router_id"] or local or str(neighbours[0].local)
    argv = [a for a in sys.argv[1:] if a != "--exabgp-config"]
    return exabgp_config(
        router_id=router_id,
        local_address=local,
        local_as=options["local_as"],
        sessions=setup.sessions,
        process=[sys.executable, "-m", "gtmctl", *argv],
    )


async def _speaker(options: dict[str, Any], setup: _Setup) -> Speaker:
    if options["speaker"] == SpeakerKind.BIRD:
        return BirdSpeaker(
            options["bird_include"],
            setup.attrs,
            sessions=setup.sessions,
            control_socket=options["bird_socket"],
            birdc=options["birdc"],
        )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return ExaBgpSpeaker(reader, FileLineWriter(sys.stdout.fileno()), setup.attrs)


async def _run(options: dict[str, Any], setup: _Setup) -> None:
    registry = new_registry()
    clock = SystemClock()
    supervisor = TaskSupervisor(registry=registry, clock=clock, component="anycast")
    store = None
    if options["state"] is not None:
        store = open_store(options["state"], clock=clock, registry=registry)
        snapshots = SnapshotWatcher(store, clock=clock, registry=registry, component="anycast")
        supervisor.spawn("snapshots", snapshots.run())
        fleet = FleetSignals(snapshots, setup.policy, options["require_summaries"])
        setup = replace(setup, source=replace(setup.source, fleet=fleet))
    try:
        await _control(options, setup, registry, supervisor)
    finally:
        await supervisor.aclose()
        if store is not None:
            await store.aclose()


async def _control(
    options: dict[str, Any],
    setup: _Setup,
    registry: CollectorRegistry,
    supervisor: TaskSupervisor,
) -> None:
    controller = AnycastController(
        setup.prefixes,
        setup.source,
        await _speaker(options, setup),
        setup.drain,
        AnycastMetrics(registry),
        interval_s=options["interval"],
        linger_s=options["linger"],
    )

    async def stop_when_signalled() -> None:
        # SIGINT/SIGTERM: the controller withdraws, waits for it to take, then returns.
        await until_signalled()
        controller.stop()

    supervisor.spawn("signals", stop_when_signalled())
    if options["speaker"] != SpeakerKind.BIRD:
        supervisor.spawn("exabgp", exit_with_parent(os.getppid(), controller))
    if not options["metrics_listen"]:
        await controller.run()
        return
    host, _, port = options["metrics_listen"].rpartition(":")
    app = _app(controller, registry)
    async with serving(app, host or "127.0.0.1", int(port), what="anycast metrics"):
        await controller.run()


async def exit_with_parent(parent: int, controller: AnycastController) -> None:
    """Abandon once ``parent`` (ExaBGP, which runs this process and reads its commands)
    exits. Without it an orphan would run on forever (it reads its pipe only to wait
    for an acknowledgement), holding its metrics port against the process a restarted
    ExaBGP starts. A pidfd becomes readable when its process exits (Linux ≥ 5.3)."""
    try:
        fd = os.pidfd_open(parent)
    except OSError as exc:  # (no pidfd here: the orphan check is lost, and said so)
        log.warning("anycast: cannot watch ExaBGP (pid %d) for its exit: %s", parent, exc)
        return
    gone = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, gone.set)  # (at once if it has exited already)
    try:
        await gone.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    log.error("anycast: ExaBGP (pid %d) is gone; exiting without a withdrawal", parent)
    controller.abandon()


def _app(controller: AnycastController, registry: CollectorRegistry) -> web.Application:
    app = web.Application()

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"ready": controller.plan is not None})

    async def state(request: web.Request) -> web.Response:
        return web.json_response(controller.state())

    add_service_routes(app, registry=registry, readyz=readyz)
    app.router.add_get("/api/v1/anycast", state)
    return app

"""``gtm global`` (run the global tier) and ``gtm route`` (ask for a decision, print its trace)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import sys
from typing import Any

import click

from global_lb.app import GlobalTier, build_routers, load_policy
from global_lb.config import (
    DEFAULT_DNS_LISTEN,
    DEFAULT_HTTP_LISTEN,
    FrontDoorConfig,
    GlobalConfig,
)
from global_lb.dns.options import zone_config, zone_options
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.server import parse_listen
from global_lb.dns.zone import DEFAULT_TTL, DEFAULT_ZONE
from global_lb.geo import DEFAULT_RELOAD_INTERVAL_S, load_geo_map, open_locator
from global_lb.health import HealthTable
from global_lb.keeper import build_view, load_topology
from global_lb.profiles import (
    BUILTIN_REQUEST_PROFILES,
    NEAREST_PROFILE_NAME,
    REQUEST_PROFILE_NAME,
)
from global_lb.router import RouteOutcome
from gtm import native
from gtm.access import access_log_option
from gtm.audit_anchor import DEFAULT_INTERVAL_S as DEFAULT_ANCHOR_INTERVAL_S
from gtm.cli_types import HostPort, IPAddress, IPNetwork, StateURL, geoip_reload_interval
from gtm.clock import SystemClock
from gtm.envvars import from_environment
from gtm.errors import ConfigError, GtmError
from gtm.logs import announce
from gtm.metrics import new_registry
from gtm.models import ClientInfo, RouteRequest
from gtm.serve import until_signalled
from gtm.state.snapshot import FleetSnapshot, SnapshotWatcher
from gtm.state.url import open_store
from gtm.tasks import TaskSupervisor
from gtm.tls import TlsConfig, click_options, config_from_options, material
from gtm.tracing import OFF, Tracing, open_tracing, trace_options

log = logging.getLogger(__name__)


def _fail(exc: Exception) -> None:
    click.echo(f"gtm: {exc}", err=True)
    sys.exit(2)


@from_environment
@click.command(name="global")
@access_log_option()
@trace_options()
@click.option(
    "--dns-listen",
    type=HostPort(example=DEFAULT_DNS_LISTEN, off=True),
    default=DEFAULT_DNS_LISTEN,
    show_default=True,
    help="DNS HOST:PORT (UDP and TCP); 'off' disables.",
)
@click.option(
    "--http-listen",
    type=HostPort(example=DEFAULT_HTTP_LISTEN, off=True),
    default=DEFAULT_HTTP_LISTEN,
    show_default=True,
    help="Front door HOST:PORT; 'off' disables.",
)
@click.option(
    "--state",
    type=StateURL(),
    default="memory",
    show_default=True,
    help="State store: memory or etcd://HOST:PORT[,...].",
)
@click.option(
    "--policies",
    "policies",
    multiple=True,
    type=click.Path(exists=True),
    help="Policy files/dirs, in force until a policy is applied to the store (default: the "
    "store's policy, and the tier does not serve until there is one; with --state memory, "
    "the shipped examples). Repeatable.",
)
@click.option(
    "--geoip-db",
    type=click.Path(exists=True, dir_okay=False),
    help="MaxMind City/Country .mmdb (default: the bundled 2018 GeoLite2-City, stale).",
)
@geoip_reload_interval(DEFAULT_RELOAD_INTERVAL_S)
@click.option(
    "--geo-map",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML of networks → country/location (private ranges, test prefixes).",
)
@click.option(
    "--topology",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML 'regions:' records with regional LB endpoints.",
)
@click.option("--zone", default=DEFAULT_ZONE, show_default=True, help="The DNS zone served.")
@click.option(
    "--ttl",
    default=DEFAULT_TTL,
    show_default=True,
    type=click.IntRange(0, 86400),
    help="Answer TTL, seconds.",
)
@zone_options()
@click.option(
    "--rrl-rate",
    default=1000.0,
    show_default=True,
    type=click.FloatRange(0),
    help="DNS responses/s per client prefix (0: no rate limiting).",
)
@click.option(
    "--trusted-proxy",
    "trusted",
    type=IPNetwork(),
    multiple=True,
    help="Network whose X-Forwarded-For is trusted. Repeatable.",
)
@click.option(
    "--audit-dir", type=click.Path(file_okay=False), help="Directory of the residency audit trail."
)
@click.option(
    "--audit-anchor-interval",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_ANCHOR_INTERVAL_S,
    show_default=True,
    help="At most this many seconds between an audit record and the chain's anchor in the "
    "state store (what `gtm audit verify --state` checks a cut tail against).",
)
@click.option(
    "--peer-token",
    envvar="GTM_PEER_TOKEN",
    default=None,
    help="Key shared by the tiers (env GTM_PEER_TOKEN): forwards are signed with it, so "
    "regional LBs believe the client location found here.",
)
@click.option(
    "--require-summaries", is_flag=True, help="Treat regions without a published summary as down."
)
@click.option(
    "--reuse-port", is_flag=True, help="SO_REUSEPORT, to run several worker processes on one port."
)
@click.option(
    "--dns-workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="DNS processes sharing the DNS port (SO_REUSEPORT), this one included; "
    "one per core answers the most queries/s.",
)
@click.option(
    "--profile",
    default=REQUEST_PROFILE_NAME,
    show_default=True,
    help="The front door's routing profile: the policy set's profile of that name, else "
    f"a built-in one ({', '.join(BUILTIN_REQUEST_PROFILES)}; {NEAREST_PROFILE_NAME}: the "
    "nearest region residency allows, by round trip alone, for comparisons).",
)
@click.option(
    "--no-affinity",
    is_flag=True,
    help="Decide every request afresh: no going back to the region a prompt's prefix was "
    "just sent to (for side-by-side comparisons).",
)
@click_options("global")
@click.option(
    "--front-door-tls",
    is_flag=True,
    help="Serve the front door over TLS too, with the --tls-cert certificate (clients need "
    "no certificate of their own). Without it the front door is plain HTTP, as a local "
    "listener behind a TLS-terminating load balancer usually is.",
)
def global_cmd(**options: Any) -> None:
    """Run the global tier: GeoDNS (EDNS Client Subnet) and the HTTP front door."""
    try:
        config = _config(options)
        _warn_if_undelegatable(config)
        tls = config_from_options(options)
        if options["front_door_tls"] and tls is None:
            raise ConfigError("--front-door-tls needs --tls-ca, --tls-cert and --tls-key")
        native.warn_if_not_compiled("global_lb.kernels", "global_lb.plugins._ttft", "gtm._tokens")
        tracing = open_tracing(
            options["trace_exporter"], service="gtm-global", file=options["trace_file"]
        )
        try:
            asyncio.run(
                _serve(config, tls, front_door_tls=options["front_door_tls"], tracing=tracing)
            )
        finally:
            tracing.shutdown()
    except GtmError as exc:
        _fail(exc)


def _warn_if_undelegatable(config: GlobalConfig) -> None:
    """A DNS server reachable from elsewhere whose in-zone name servers have no address
    cannot be delegated to: say so at start (a local one, as gtm up's, need not be)."""
    missing = config.zone.without_glue()
    if not missing or config.dns_listen is None:
        return
    host, _ = parse_listen(config.dns_listen, 53)
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:  # a host name
        if host == "localhost":
            return
    log.warning(
        "dns: name server %s is inside the zone but has no address: a parent zone cannot "
        "delegate to it; give its addresses (--ns LABEL=ADDR,...; docs/dns-delegation.md)",
        ", ".join(missing),
    )


def _config(options: dict[str, Any]) -> GlobalConfig:
    trusted = tuple(options["trusted"])
    return GlobalConfig(
        dns_listen=None if options["dns_listen"] == "off" else options["dns_listen"],
        http_listen=None if options["http_listen"] == "off" else options["http_listen"],
        state=options["state"],
        policies=tuple(options["policies"]),
        geoip_db=options["geoip_db"],
        geoip_reload_interval_s=options.get("geoip_reload_interval", DEFAULT_RELOAD_INTERVAL_S),
        geo_map=options["geo_map"],
        topology=options["topology"],
        audit_dir=options["audit_dir"],
        audit_anchor_interval_s=options.get("audit_anchor_interval", DEFAULT_ANCHOR_INTERVAL_S),
        zone=zone_config(options, zone=options["zone"], ttl=options["ttl"]),
        rrl=RrlConfig(rate=options["rrl_rate"]),
        front_door=FrontDoorConfig(
            trusted_proxies=trusted,
            peer_token=options.get("peer_token") or None,
            affinity=not options.get("no_affinity", False),
        ),
        profile=options.get("profile") or REQUEST_PROFILE_NAME,
        require_summaries=options["require_summaries"],
        reuse_port=options["reuse_port"],
        dns_workers=options["dns_workers"],
    )


async def _serve(
    config: GlobalConfig,
    tls: TlsConfig | None = None,
    *,
    front_door_tls: bool = False,
    tracing: Tracing = OFF,
) -> None:
    clock, registry = SystemClock(), new_registry()
    tier = GlobalTier(
        config,
        clock=clock,
        registry=registry,
        tls=material(tls, clock=clock, registry=registry),
        front_door_tls=front_door_tls,
        tracing=tracing,
    )
    endpoints = await tier.start()
    try:
        if endpoints.dns is not None:
            workers = f", {config.dns_workers} processes" if config.dns_workers > 1 else ""
            announce(
                f"gtm global: DNS (UDP+TCP) on {endpoints.dns}, zone {config.zone.zone}{workers}"
            )
        if endpoints.http is not None:
            announce(f"gtm global: front door on {endpoints.http}")
        await until_signalled()
    finally:
        await tier.stop()


# ---------------------------------------------------------------------------- gtm route


@click.command(name="route")
@click.option(
    "--client-ip",
    type=IPAddress(),
    required=True,
    help="The client's address (as the front door would see it).",
)
@click.option("--tenant", required=True, help="Tenant id (as the API key would resolve).")
@click.option("--model", required=True, help="Model name.")
@click.option("--data-class", default="default", show_default=True)
@click.option("--input-tokens", default=1000, show_default=True, type=click.IntRange(0))
@click.option(
    "--policies",
    "policies",
    multiple=True,
    type=click.Path(exists=True),
    help="Policy files/dirs (default: the shipped examples).",
)
@click.option(
    "--geoip-db",
    type=click.Path(exists=True, dir_okay=False),
    help="MaxMind .mmdb (default: the bundled GeoLite2-City).",
)
@click.option("--geo-map", type=click.Path(exists=True, dir_okay=False))
@click.option("--topology", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--state",
    type=StateURL(),
    default=None,
    help="Read regions, summaries and drains from this store (default: none, the static topology).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
def route(**options: Any) -> None:
    """Ask for a region decision and print its trace.

    Works without a running deployment: by default it decides over the example
    topology and policies, with every region healthy and no load published.
    """
    try:
        outcome = asyncio.run(_route(options))
    except GtmError as exc:
        _fail(exc)
        return
    if options["as_json"]:
        click.echo(json.dumps(outcome.to_json(), indent=2))
    else:
        click.echo(render(outcome))
    sys.exit(0 if outcome.refusal is None else 1)


async def _route(options: dict[str, Any]) -> RouteOutcome:
    address = options["client_ip"]
    policy = load_policy(tuple(options["policies"]))
    config = GlobalConfig(policies=tuple(options["policies"]), decision_cache=0)
    router, _ = build_routers(policy, config, None)
    cidr = load_geo_map(options["geo_map"]) if options["geo_map"] else None
    location = open_locator(options["geoip_db"], cidr).locate(address)
    snapshot = await _snapshot(options["state"])
    topology = load_topology(options["topology"]) if options["topology"] else ()
    view = build_view(policy, snapshot, HealthTable(), topology=topology)
    try:
        request = RouteRequest(
            model=options["model"],
            input_tokens=options["input_tokens"],
            tenant=options["tenant"],
            data_class=options["data_class"],
            client=ClientInfo(ip=address, country=location.country, location=location.point),
        )
    except ValueError as exc:
        raise ConfigError(f"invalid request: {exc}") from None
    return router.decide(request, view, location)


async def _snapshot(state: str | None) -> FleetSnapshot:
    if state is None:
        return FleetSnapshot(revision=0)
    registry = new_registry()
    store = open_store(state, clock=SystemClock(), registry=registry)
    watcher = SnapshotWatcher(store, clock=SystemClock(), registry=registry)
    supervisor = TaskSupervisor(registry=registry, component="route")
    supervisor.spawn("snapshot", watcher.run())
    try:
        async with asyncio.timeout(10.0):
            return await watcher.wait_ready()
    except TimeoutError:
        raise ConfigError(f"--state {state}: no snapshot within 10 s") from None
    finally:
        await supervisor.aclose()
        await store.aclose()


def render(outcome: RouteOutcome) -> str:
    """The decision and its trace, for people."""
    data = outcome.to_json()
    lines = [f"decision {outcome.decision_id}"]
    client = data["client"]
    if client is not None:
        where = client["location"]
        point = "" if where is None else f" at {where['lat']:.2f},{where['lon']:.2f}"
        lines.append(
            f"client:    {client['country'] or 'unknown country'}{point} "
            f"(network {client['network']}, {client['source']})"
        )
    residency = data["residency"]
    lines.append(
        f"residency: {residency['reason']}, rule {residency['rule']!r}, "
        f"allowed {{{', '.join(data['allowed']) or 'none'}}}"
        + (f", denied by {', '.join(residency['denied_by'])}" if residency["denied_by"] else "")
    )
    if outcome.refusal is not None:
        lines.append(f"REFUSED:   {outcome.refusal.value} (HTTP {outcome.http_status})")
        lines.append(f"           {outcome.detail}")
    else:
        ttft = outcome.predicted_ttft_ms
        lines.append(
            f"region:    {outcome.region}"
            + ("" if ttft is None else f" (predicted TTFT {ttft:.1f} ms)")
        )
        lines.append(f"fallbacks: {', '.join(outcome.fallbacks) or 'none'}")
    trace = data["trace"]
    if trace is not None:
        lines.append(f"profile {trace['profile']}: {len(trace['candidates'])} candidates")
        for step in trace["filters"]:
            lines.append(f"  filter {step['plugin']}: {step['remaining']} left")
            lines.extend(f"    - {r['region']}: {r['why']}" for r in step["removed"])
        for row in trace["scores"]:
            parts = ", ".join(f"{k} {v:.3f}" for k, v in row["scores"].items())
            lines.append(f"  score {row['region']:<14} total {row['total']:.3f}  ({parts})")
        lines.append(f"  picker {trace['picker']}")
    lines.append("reasons: " + ", ".join(outcome.reasons))
    return "\n".join(lines)

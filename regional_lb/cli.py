"""``gtm regional``: run one region's regional LB replica until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from types import MappingProxyType

import click

from gtm.access import access_log_option
from gtm.audit_anchor import DEFAULT_INTERVAL_S as DEFAULT_ANCHOR_INTERVAL_S
from gtm.cli_types import HostPort, HttpURL, IPNetwork, StateURL, geoip_reload_interval
from gtm.clock import SystemClock
from gtm.envvars import from_environment
from gtm.errors import GtmError
from gtm.geo import DEFAULT_RELOAD_INTERVAL_S, GeoLocator, load_geo_map, open_locator
from gtm.geo import IPNetwork as GeoNetwork
from gtm.logs import announce
from gtm.metrics import new_registry
from gtm.net import split_host_port
from gtm.policy_store import ActivePolicy, activate
from gtm.serve import settle_collector, until_signalled
from gtm.state.url import open_store
from gtm.tls import TlsConfig, click_options, config_from_options, material
from gtm.tracing import OFF, Tracing, open_tracing, trace_options
from policies import AuditWriter, PolicyError, load_paths
from policies.types import is_identifier
from regional_lb.app import RegionalService, RegionalSettings, serving
from regional_lb.leases import DEFAULT_SAFE_SHARE, LeaseSettings
from regional_lb.priority import SplitMode
from regional_lb.profiles import PROFILE_NAME
from regional_lb.router import RouterSettings
from regional_lb.spill import NO_SPILL, SpillSettings
from regional_lb.view import ViewSettings


def _zone_urls(values: tuple[str, ...]) -> dict[str, str]:
    urls: dict[str, str] = {}
    for value in values:
        zone, sep, url = value.partition("=")
        if not sep or not is_identifier(zone) or not url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{value!r} is not ZONE=URL (e.g. eu-west-a=http://10.0.0.5:8100)"
            )
        urls[zone] = url.rstrip("/")
    return urls


def _identifier(name: str, value: str) -> str:
    if not is_identifier(value):
        raise click.BadParameter(f"{name} {value!r} must be a lowercase id (a-z, 0-9, '-')")
    return value


@from_environment
@click.command("regional", context_settings={"help_option_names": ["-h", "--help"]})
@access_log_option()
@trace_options()
@click.option("--region", required=True, help="Region id (e.g. eu-west).")
@click.option(
    "--state",
    type=StateURL(),
    default="memory",
    show_default=True,
    help="State store: memory or etcd://HOST:PORT[,...] (zone summaries are read there; "
    "quota leases and the region summary are written there).",
)
@click.option(
    "--listen",
    type=HostPort(example="127.0.0.1:8081"),
    default="127.0.0.1:8081",
    show_default=True,
    help="HOST:PORT to listen on.",
)
@click.option(
    "--policies",
    "policies_dir",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Policy files (a directory or file) in force until a policy is applied to the "
    "store, which then replaces them and is hot-reloaded (the front door's rule); without "
    "it, the replica is not ready until a policy is applied.",
)
@click.option("--replica-id", default=None, help="This replica's id (default: REGION-PID).")
@click.option(
    "--advertise-url",
    type=HttpURL(),
    default=None,
    help="URL peers and the global tier use to reach this replica (default: the bound "
    "http://HOST:PORT).",
)
@click.option(
    "--zone-url",
    "zone_urls",
    multiple=True,
    help="ZONE=URL of a zone agent (repeatable); Zone records in the store take precedence.",
)
@click.option("--local-zone", default=None, help="The zone this replica runs in (lower RTT).")
@click.option("--profile", default=PROFILE_NAME, show_default=True, help="Routing profile name.")
@click.option(
    "--safe-share",
    type=click.FloatRange(0.0, 1.0),
    default=DEFAULT_SAFE_SHARE,
    show_default=True,
    help="Share of a tenant's quota pool used without a valid capacity lease (store down).",
)
@click.option(
    "--audit-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Append-only audit log of residency refusals and spill decisions.",
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
    "--spill-unknown-location",
    is_flag=True,
    help="Spill even without --peer-token (by default a replica without the tiers' key "
    "does not spill: a peer could not believe its hop count). Clients of unknown location "
    "are spilled within what the policy's unknown_client_location allows either way.",
)
@click.option(
    "--split",
    "split_mode",
    type=click.Choice([m.value for m in SplitMode]),
    default=SplitMode.CAPACITY.value,
    show_default=True,
    help="What share of the traffic to spill before a zone is full: 'capacity' spills the "
    "admitted demand the zones' measured headroom cannot take; 'envoy' spills by the share "
    "of unhealthy GPUs (Envoy's overprovisioning factor 1.4), whatever the load.",
)
@click.option(
    "--peer-token",
    envvar="GTM_PEER_TOKEN",
    default=None,
    help="Key shared by the tiers (env GTM_PEER_TOKEN): the front door and peer regions "
    "sign their x-gtm- headers with it (the client's location among them; spilled "
    "requests are not charged twice); without it every client is located here and "
    "nothing is spilled.",
)
@click.option(
    "--geoip-db",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="MaxMind City/Country database to locate clients that come here directly (the "
    "front door's; default: the bundled GeoLite2-City, stale).",
)
@geoip_reload_interval(DEFAULT_RELOAD_INTERVAL_S)
@click.option(
    "--geo-map",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Networks located by configuration (the front door's --geo-map).",
)
@click.option(
    "--trusted-proxy",
    "trusted",
    type=IPNetwork(),
    multiple=True,
    help="Network whose X-Forwarded-For is believed when locating a client. Repeatable.",
)
@click.option(
    "--no-affinity",
    is_flag=True,
    help="Choose every request's zone afresh: no going back to the zone a prompt's prefix "
    "was just sent to (for side-by-side comparisons).",
)
@click.option(
    "--no-spill",
    is_flag=True,
    help="Never pass a request to a peer region: serve or queue it here (a single-region "
    "balancer, for side-by-side comparisons).",
)
@click_options("regional")
def regional(
    region: str,
    state: str,
    listen: str,
    policies_dir: Path | None,
    replica_id: str | None,
    advertise_url: str | None,
    zone_urls: tuple[str, ...],
    local_zone: str | None,
    profile: str,
    safe_share: float,
    audit_dir: Path | None,
    audit_anchor_interval: float,
    spill_unknown_location: bool,
    split_mode: str,
    peer_token: str | None,
    geoip_db: str | None,
    geoip_reload_interval: float,
    geo_map: str | None,
    trusted: tuple[GeoNetwork, ...],
    no_affinity: bool = False,
    no_spill: bool = False,
    trace_exporter: str = "none",
    trace_file: str | None = None,
    **tls_options: object,
) -> None:
    """Run one region's regional LB: quotas, fair queueing, zone choice, spillover."""
    try:
        host, port = split_host_port(listen, example="127.0.0.1:8081")
        tls = config_from_options(tls_options)
    except GtmError as exc:
        raise click.UsageError(str(exc)) from None
    region = _identifier("--region", region)
    replica = _identifier("--replica-id", replica_id or f"{region}-{os.getpid()}")
    policy: ActivePolicy | None = None
    if policies_dir is not None:
        try:
            policy = activate(0, load_paths([policies_dir]))
        except PolicyError as exc:
            raise click.UsageError(f"--policies: {exc}") from None
        if region not in policy.policy_set.regions:
            raise click.UsageError(f"--region {region!r} is not a region of the policy set")
    settings = RegionalSettings(
        region=region,
        replica_id=replica,
        advertise_url=advertise_url,
        leases=LeaseSettings(safe_share=safe_share),
        router=RouterSettings(
            split_mode=SplitMode(split_mode),
            spill_requires_client_country=not spill_unknown_location,
            spill=NO_SPILL if no_spill else SpillSettings(),
        ),
        view=ViewSettings(local_zone=local_zone, zone_urls=MappingProxyType(_zone_urls(zone_urls))),
        profile_name=profile,
        peer_token=peer_token or None,
        trusted_proxies=trusted,
        affinity=not no_affinity,
        audit_anchor_interval_s=audit_anchor_interval,
    )
    try:
        cidr = load_geo_map(geo_map) if geo_map else None
        reload = (SystemClock(), geoip_reload_interval) if geoip_reload_interval > 0 else None
        locator = open_locator(geoip_db, cidr, reload=reload)
        tracing = open_tracing(
            trace_exporter,
            service="gtm-regional",
            file=trace_file,
            attributes={"gtm.region": region, "service.instance.id": replica},
        )
        try:
            asyncio.run(
                serve(
                    settings,
                    state,
                    host,
                    port,
                    policy,
                    audit_dir,
                    tls,
                    locator=locator,
                    tracing=tracing,
                )
            )
        finally:
            tracing.shutdown()
    except GtmError as exc:
        click.echo(f"gtm regional: {exc}", err=True)
        sys.exit(2)


async def serve(
    settings: RegionalSettings,
    state: str,
    host: str,
    port: int,
    policy: ActivePolicy | None,
    audit_dir: Path | None,
    tls: TlsConfig | None = None,
    *,
    locator: GeoLocator | None = None,
    tracing: Tracing = OFF,
) -> None:
    """Run the replica until SIGINT or SIGTERM, then stop cleanly."""
    clock = SystemClock()
    registry = new_registry()
    tls_material = material(tls, clock=clock, registry=registry)
    store = open_store(state, clock=clock, registry=registry)
    audit = AuditWriter(audit_dir, prefix="regional") if audit_dir is not None else None
    service = RegionalService(
        settings,
        store=store,
        clock=clock,
        registry=registry,
        policy=policy,
        audit=audit,
        tls=tls_material,
        locator=locator,
        tracing=tracing,
    )
    try:
        async with serving(service, host, port):
            settle_collector()
            announce(
                f"regional LB {settings.region} (replica {settings.replica_id}) listening on "
                f"{service.advertise_url}"
            )
            sys.stdout.flush()
            await until_signalled()
    finally:
        await store.aclose()
        if audit is not None:
            audit.close()

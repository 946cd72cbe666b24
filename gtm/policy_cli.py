"""``gtm policy``: the policies package's commands plus ``apply``, which needs the
state store (and so lives in gtm, which may import policies — not the reverse), and the
GeoIP lookup of ``explain --client-ip``: the front door's locator (:mod:`gtm.geo`) with
its default database, handed to the policies command through the click context.

The group is built from the policies group's commands without modifying it, so
``python -m policies policy`` stays store-free.
"""

from __future__ import annotations

import asyncio
import getpass
import ipaddress
import sys
from pathlib import Path

import click

from gtm.clock import SystemClock
from gtm.errors import ConfigError, StateError
from gtm.geo import ChainLocator, LocationSource, MaxMindLocator, bundled_database
from gtm.metrics import new_registry
from gtm.policy_store import ApplyResult, apply
from gtm.state.url import StateUrl, StoreKind, open_store, parse_state_url
from policies import cli as policies_cli
from policies.loader import DEFAULT_MAX_BYTES
from policies.policyset import PolicySet


@click.command("apply")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--state", required=True, help="Store to apply to: etcd://HOST:PORT[,HOST:PORT…].")
@click.option(
    "--expected-revision",
    type=click.IntRange(min=0),
    help="Fail unless the store is at this policy generation (0: nothing applied yet).",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    help="Refuse policy files larger than this.",
)
def apply_command(
    paths: tuple[Path, ...], state: str, expected_revision: int | None, max_bytes: int
) -> None:
    """Validate policy files and commit them to the state store as a new generation.

    Nothing is written unless every file is valid. Tiers watching the store switch to
    the new generation; a generation they cannot load leaves the old one in force.
    """
    try:
        url = parse_state_url(state)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--state") from None
    if url.kind is StoreKind.MEMORY:
        raise click.BadParameter(
            "the embedded store lives inside one `gtm up` process; give it the files with "
            "`gtm up --policies DIR`, or apply to etcd://…",
            param_hint="--state",
        )
    policy_set = policies_cli.load_or_exit(paths, max_bytes)
    try:
        result = asyncio.run(_apply(url, policy_set, expected_revision))
    except StateError as exc:
        click.echo(f"gtm policy apply: {exc}", err=True)
        sys.exit(policies_cli.EXIT_INVALID)
    if result.changed:
        click.echo(
            f"applied generation {result.generation} (digest {policy_set.digest[:16]}): "
            f"{result.written} document(s) written, {result.deleted} deleted"
        )
    else:
        click.echo(f"unchanged: generation {result.generation} already has these policies")


async def _apply(url: StateUrl, policy_set: PolicySet, expected: int | None) -> ApplyResult:
    clock = SystemClock()
    store = open_store(url, clock=clock, registry=new_registry())
    try:
        return await apply(store, policy_set, expected, clock=clock, applied_by=_who())
    finally:
        await store.aclose()


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def locate(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, geoip_db: Path | None
) -> tuple[str | None, str]:
    """Where the front door would place ``address``: its special-purpose networks, then
    ``geoip_db`` or, by default, the database it uses by default (bundled GeoLite2-City)."""
    try:
        database = MaxMindLocator(geoip_db if geoip_db is not None else bundled_database())
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--geoip-db") from None
    try:
        location = ChainLocator(database).locate(address)
    finally:
        database.close()
    source = str(geoip_db) if geoip_db is not None else "the bundled GeoLite2-City database"
    if location.source is LocationSource.CIDR_MAP:
        return None, "a private or special-purpose address: location unknown"
    if location.country is None:
        return None, f"not in {source}: location unknown"
    return location.country, f"{source}, network {location.network}"


@click.pass_context
def _with_locator(ctx: click.Context) -> None:
    ctx.meta[policies_cli.LOCATE_KEY] = locate


policy = click.Group(
    name="policy",
    help="Check, apply, explain policy files; print their schema; hash API keys.",
    commands={**policies_cli.policy.commands, "apply": apply_command},
    callback=_with_locator,
)

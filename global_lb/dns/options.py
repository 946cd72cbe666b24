"""The zone's NS set and SOA on a command line: ``gtm global --ns/--soa-*`` and the same
options of ``gtm up`` (``--dns-ns``, ``--dns-soa-*``), which passes them on.

One declaration for both commands (:func:`zone_options`, with a prefix), one reading
(:func:`zone_config`: a bad value is a usage error naming its option, before anything
starts), and the way back (:func:`zone_flags`: a configuration as ``gtm global`` flags,
for a child process). Light on purpose: it imports the configuration, not the tier.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from global_lb.dns.zone_config import (
    DEFAULT_EXPIRE,
    DEFAULT_REFRESH,
    DEFAULT_RETRY,
    NameServer,
    SerialPolicy,
    ZoneConfig,
)

_F = TypeVar("_F", bound=Callable[..., Any])
_MAX_TIMER = (1 << 31) - 1


class NameServerSpec(click.ParamType[NameServer]):
    """``NAME[=ADDRESS,...]``: a name server of the zone and, when it is inside the zone,
    its addresses (the glue)."""

    name = "NAME[=ADDR,...]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> NameServer:
        if isinstance(value, NameServer):
            return value
        name, _, listed = str(value).strip().partition("=")
        addresses = []
        for text in (a.strip() for a in listed.split(",") if a.strip()):
            try:
                addresses.append(ipaddress.ip_address(text))
            except ValueError:
                self.fail(f"{value!r}: {text!r} is not an IP address", param, ctx)
        try:
            return NameServer(name=name, addresses=tuple(addresses))
        except ValidationError as exc:
            why = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            self.fail(
                f"{value!r}: {why} (e.g. ns1=192.0.2.53,2001:db8::53 or ns1.example.net.)",
                param,
                ctx,
            )


class SerialSpec(click.ParamType[int | None]):
    """``unixtime|N``: ``None`` for the unixtime policy, else the fixed number."""

    name = "unixtime|N"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == SerialPolicy.UNIXTIME:
            return None
        if text.isdigit() and int(text) < 1 << 32:
            return int(text)
        self.fail(f"{value!r}: expected 'unixtime' or a number 0..4294967295", param, ctx)


#: ZoneConfig fields → the option (without its prefix) that sets them.
OPTION_OF_FIELD = {
    "name_servers": "ns",
    "primary": "soa-mname",
    "hostmaster": "soa-rname",
    "serial": "soa-serial",
    "refresh": "soa-refresh",
    "retry": "soa-retry",
    "expire": "soa-expire",
    "negative_ttl": "soa-minimum",
}


def zone_options(prefix: str = "") -> Callable[[_F], _F]:
    """The NS and SOA options, named ``--{prefix}ns``, ``--{prefix}soa-…``."""
    timer = click.IntRange(1, _MAX_TIMER)
    options = [
        click.option(
            f"--{prefix}ns",
            type=NameServerSpec(),
            multiple=True,
            help="A name server of the zone, in the NS answer: one label under the zone "
            "with its addresses (glue, given to the parent zone too), e.g. "
            "ns1=192.0.2.53,2001:db8::53, or an absolute name outside it "
            "(ns1.example.net.). Repeatable. Default: ns1 (no addresses).",
        ),
        click.option(
            f"--{prefix}soa-mname",
            default=None,
            help="SOA MNAME, the primary name server (default: the first name server).",
        ),
        click.option(
            f"--{prefix}soa-rname",
            default="hostmaster",
            show_default=True,
            help="SOA RNAME, the zone's contact: a mailbox (dns@example.com), an absolute "
            "name, or a label under the zone.",
        ),
        click.option(
            f"--{prefix}soa-serial",
            type=SerialSpec(),
            default="unixtime",
            show_default=True,
            help="SOA SERIAL: 'unixtime' (the time the answers last changed) or a fixed "
            "number (the same on every server of the NS set).",
        ),
        click.option(
            f"--{prefix}soa-refresh",
            type=timer,
            default=DEFAULT_REFRESH,
            show_default=True,
            help="SOA REFRESH, seconds.",
        ),
        click.option(
            f"--{prefix}soa-retry",
            type=timer,
            default=DEFAULT_RETRY,
            show_default=True,
            help="SOA RETRY, seconds.",
        ),
        click.option(
            f"--{prefix}soa-expire",
            type=timer,
            default=DEFAULT_EXPIRE,
            show_default=True,
            help="SOA EXPIRE, seconds (at least refresh + retry).",
        ),
        click.option(
            f"--{prefix}soa-minimum",
            type=click.IntRange(0, 86400),
            default=None,
            help="SOA MINIMUM: how long resolvers cache NXDOMAIN/NODATA answers, seconds "
            "(RFC 2308; default: the answer TTL).",
        ),
    ]

    def decorate(command: _F) -> _F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def zone_config(options: dict[str, Any], *, zone: str, ttl: int, prefix: str = "") -> ZoneConfig:
    """The zone from the options of :func:`zone_options` (their click parameter names,
    ``prefix`` with ``_`` for ``-``); a bad one is a usage error naming its option."""
    key = prefix.replace("-", "_")

    def get(name: str, default: Any = None) -> Any:
        found = options.get(key + name)
        return default if found is None else found

    serial = get("soa_serial")
    minimum = get("soa_minimum")
    fields: dict[str, Any] = {
        "zone": zone,
        "ttl": ttl,
        "negative_ttl": ttl if minimum is None else minimum,
        "hostmaster": get("soa_rname", "hostmaster"),
        "primary": get("soa_mname"),
        "serial_policy": SerialPolicy.UNIXTIME if serial is None else SerialPolicy.FIXED,
        "refresh": get("soa_refresh", DEFAULT_REFRESH),
        "retry": get("soa_retry", DEFAULT_RETRY),
        "expire": get("soa_expire", DEFAULT_EXPIRE),
    }
    if serial is not None:
        fields["serial"] = serial
    if get("ns"):
        fields["name_servers"] = tuple(get("ns"))
    try:
        return ZoneConfig(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = error["msg"].removeprefix("Value error, ")
        field = str(error["loc"][0]) if error["loc"] else message.partition(":")[0]
        if not error["loc"]:
            message = message.partition(": ")[2] or message
        option = OPTION_OF_FIELD.get(field)
        hint = f"--{prefix}{option}" if option else field
        raise click.BadParameter(message, param_hint=hint) from None


def zone_flags(config: ZoneConfig) -> list[str]:
    """``config``'s NS set and SOA as ``gtm global`` flags (the zone and TTL are not:
    they have flags of their own)."""
    flags: list[str] = []
    for ns in config.name_servers:
        addresses = ",".join(str(a) for a in ns.addresses)
        flags += ["--ns", f"{ns.name}={addresses}" if addresses else ns.name]
    if config.primary is not None:
        flags += ["--soa-mname", config.primary]
    serial = str(config.serial) if config.serial_policy is SerialPolicy.FIXED else "unixtime"
    flags += ["--soa-rname", config.hostmaster, "--soa-serial", serial]
    flags += ["--soa-refresh", str(config.refresh), "--soa-retry", str(config.retry)]
    flags += ["--soa-expire", str(config.expire), "--soa-minimum", str(config.negative_ttl)]
    return flags


__all__ = ["NameServerSpec", "SerialSpec", "zone_config", "zone_flags", "zone_options"]

"""The zone's configuration: name, TTLs, NS set with glue, SOA fields.

Apart from :mod:`global_lb.dns.zone` (which re-exports all of it) so that what only
checks a configuration — ``gtm up``'s command line, building the flags of its ``gtm
global`` child — does not import the tier. The rules are the zone module's docstring's
"Delegation": an in-zone name server is one label directly under the zone, never
``api``; a name server outside the zone has no addresses here.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum

import dns.exception
import dns.name
from pydantic import AliasChoices, Field, field_validator, model_validator

from gtm.models import Frozen

#: Default answer TTL, seconds. Short so that failover reaches clients quickly (resolvers
#: keep an answer at most this long); 30 s is Route 53's alias-record TTL for ELB
#: targets and half the 60 s AWS recommends as the minimum for health-checked records
#: (Route 53 best-practices-dns.md) — traded for faster failover at 2× the query volume.
DEFAULT_TTL = 30
DEFAULT_ZONE = "inference.example."
#: Addresses per answer: 8 A records fit a 512-byte UDP response with room to spare,
#: as Route 53's multivalue answers do (at most 8 records).
DEFAULT_MAX_ADDRESSES = 8
#: SOA REFRESH/RETRY/EXPIRE defaults: RFC 1912 §2.2's suggested values. They are for
#: secondaries pulling the zone; gtm serves no transfers (every gtm server answers from
#: the shared state), so they matter only to zone checkers — and to operators whose
#: policy fixes them.
DEFAULT_REFRESH = 3600
DEFAULT_RETRY = 600
DEFAULT_EXPIRE = 604_800
_MAX_TIMER = (1 << 31) - 1  # RFC 2181 §8: TTL-like values are 31-bit
#: A host name's label (RFC 1123 §2.1): what a name server's name is made of.
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
#: Labels an in-zone name server may not take: ``api`` is the routed name.
_RESERVED = frozenset({"api"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class SerialPolicy(StrEnum):
    """How the SOA SERIAL is chosen (``--soa-serial``)."""

    #: Seconds since the epoch when the answers last changed (a new view), never going
    #: back (RFC 1982 arithmetic): the serial moves whenever what the zone says does.
    UNIXTIME = "unixtime"
    #: The configured number, always: every server of the NS set shows the same serial,
    #: which zone checkers (zonemaster, DNSViz) compare across the set.
    FIXED = "fixed"


def absolute_name(text: str, zone: dns.name.Name) -> dns.name.Name:
    """``text`` as an absolute name: itself when it ends in a dot, else under ``zone``.

    Raises ``ValueError`` saying what is wrong with it."""
    try:
        name = dns.name.from_text(text.strip().lower(), origin=zone)
    except dns.exception.DNSException as exc:
        raise ValueError(f"{text!r} is not a domain name: {exc}") from None
    if name == dns.name.root:
        raise ValueError(f"{text!r} is not a usable domain name")
    return name


def host_name(text: str, zone: dns.name.Name) -> dns.name.Name:
    """A server's name, as :func:`absolute_name` reads it, made of host name labels
    (letters, digits, inner hyphens)."""
    name = absolute_name(text, zone)
    for label in name.labels[:-1]:
        if not _LABEL.match(label.decode("ascii", "replace")):
            raise ValueError(
                f"{text!r} is not a host name: {label.decode('ascii', 'replace')!r} is not "
                "letters, digits and inner hyphens"
            )
    return name


def mailbox_name(text: str, zone: dns.name.Name) -> dns.name.Name:
    """An SOA RNAME: a mailbox ``user@example.com`` (RFC 1035 §8: the first dot of the
    name stands for the ``@``, dots in ``user`` are escaped), or a name as
    :func:`absolute_name` reads it (``hostmaster``: ``hostmaster.<zone>``)."""
    local, at, domain = text.strip().lower().rpartition("@")
    if not at:
        return absolute_name(text, zone)
    if not local or not domain or any(c.isspace() for c in local):
        raise ValueError(f"{text!r} is not a mailbox (e.g. hostmaster@example.com)")
    host = absolute_name(domain.rstrip(".") + ".", zone)
    try:
        return dns.name.Name((local.encode(), *host.labels))
    except dns.exception.DNSException as exc:
        raise ValueError(f"{text!r} is not a usable mailbox: {exc}") from None


class NameServer(Frozen):
    """One of the zone's name servers: its name and, inside the zone, its addresses.

    ``name`` is one label (``ns1``: a server inside the zone, ``ns1.<zone>``) or an
    absolute name ending in a dot (``ns1.example.net.``; inside the zone or not)."""

    name: str = Field(
        default="ns1", min_length=1, max_length=255, validation_alias=AliasChoices("name", "label")
    )
    #: The glue: what a resolver reaches an in-zone name server at.
    addresses: tuple[IPAddress, ...] = Field(default=(), max_length=8)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        value = value.strip().lower()
        if not value.endswith(".") and "." in value:
            raise ValueError(
                f"{value!r}: give one label under the zone (ns1) or an absolute name "
                "ending in a dot (ns1.example.net.)"
            )
        return value


class ZoneConfig(Frozen):
    zone: str = DEFAULT_ZONE
    ttl: int = Field(default=DEFAULT_TTL, ge=0, le=86_400)
    #: SOA MINIMUM: how long resolvers cache NXDOMAIN/NODATA (RFC 2308 §4); the SOA in a
    #: negative answer carries it as its TTL (at most ``ttl``, RFC 2308 §3). As short as
    #: the TTL by default, so a region coming back is seen as fast as one going away.
    negative_ttl: int = Field(default=DEFAULT_TTL, ge=0, le=86_400)
    #: The NS set, in the order answered; the first is the SOA MNAME unless ``primary``.
    name_servers: tuple[NameServer, ...] = Field(default=(NameServer(),), min_length=1)
    #: SOA RNAME: a label under the zone, an absolute name, or ``user@example.com``.
    hostmaster: str = Field(default="hostmaster", min_length=1, max_length=255)
    #: SOA MNAME (``None``: the first name server).
    primary: str | None = Field(default=None, min_length=1, max_length=255)
    serial_policy: SerialPolicy = SerialPolicy.UNIXTIME
    #: The SERIAL under :attr:`SerialPolicy.FIXED`.
    serial: int = Field(default=1, ge=0, le=(1 << 32) - 1)
    refresh: int = Field(default=DEFAULT_REFRESH, ge=1, le=_MAX_TIMER)
    retry: int = Field(default=DEFAULT_RETRY, ge=1, le=_MAX_TIMER)
    expire: int = Field(default=DEFAULT_EXPIRE, ge=1, le=_MAX_TIMER)
    max_addresses: int = Field(default=DEFAULT_MAX_ADDRESSES, ge=1, le=64)
    #: Decide DNS residency as this tenant; ``None``: any tenant's rules (see responder).
    dns_tenant: str | None = None

    @field_validator("zone")
    @classmethod
    def _absolute(cls, value: str) -> str:
        name = dns.name.from_text(value)
        if len(name.labels) < 2:
            raise ValueError("the zone must be below the root (e.g. inference.example.)")
        return name.to_text().lower()

    @model_validator(mode="after")
    def _names(self) -> ZoneConfig:
        """Errors start with the field they are about (the CLI names its option)."""
        zone = dns.name.from_text(self.zone)
        seen: set[dns.name.Name] = set()
        for ns in self.name_servers:
            where = f"name_servers: {ns.name}"
            try:
                name = host_name(ns.name, zone)
            except ValueError as exc:
                raise ValueError(f"name_servers: {exc}") from None
            if name in seen:
                raise ValueError(f"{where} is listed twice")
            seen.add(name)
            if name.is_subdomain(zone):
                relative = name.relativize(zone)
                if len(relative.labels) != 1:
                    raise ValueError(
                        f"{where}: a name server inside the zone {self.zone} must be one "
                        "label directly under it (ns1)"
                    )
                if relative.labels[0].decode() in _RESERVED:
                    raise ValueError(f"{where}: 'api' is the routed name, not a name server")
            elif ns.addresses:
                raise ValueError(
                    f"{where} is outside the zone {self.zone}: its addresses are not glue "
                    "here (they belong in its own zone); give the name alone"
                )
        try:
            mailbox_name(self.hostmaster, zone)
        except ValueError as exc:
            raise ValueError(f"hostmaster: {exc}") from None
        if self.primary is not None:
            try:
                host_name(self.primary, zone)
            except ValueError as exc:
                raise ValueError(f"primary: {exc}") from None
        if self.expire < self.refresh + self.retry:
            raise ValueError(
                f"expire: {self.expire} s is shorter than refresh + retry "
                f"({self.refresh} + {self.retry} s): a secondary would give up before retrying"
            )
        return self

    def without_glue(self) -> tuple[str, ...]:
        """The in-zone name servers given no address: a parent zone cannot delegate to
        them (nothing would say where they are)."""
        zone = dns.name.from_text(self.zone)
        return tuple(
            name.to_text()
            for name, ns in ((absolute_name(ns.name, zone), ns) for ns in self.name_servers)
            if name.is_subdomain(zone) and not ns.addresses
        )


__all__ = [
    "DEFAULT_EXPIRE",
    "DEFAULT_MAX_ADDRESSES",
    "DEFAULT_REFRESH",
    "DEFAULT_RETRY",
    "DEFAULT_TTL",
    "DEFAULT_ZONE",
    "NameServer",
    "SerialPolicy",
    "ZoneConfig",
    "absolute_name",
    "host_name",
    "mailbox_name",
]

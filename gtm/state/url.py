"""``--state`` URLs: which store a process uses, and opening it.

Accepted forms::

    memory                                  the embedded store (single process)
    etcd://HOST[:PORT][,HOST[:PORT]...]     etcd; PORT defaults to 2379, IPv6 as [::1]:2379

Parsing is cheap and imports no client library; :func:`open_store` imports the etcd
client only when an etcd URL is opened.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from gtm.errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gtm.clock import Clock
    from gtm.state.store import StateStore

#: etcd's IANA-registered client port.
DEFAULT_ETCD_PORT = 2379

ACCEPTED_FORMS = (
    "'memory' or 'etcd://HOST:PORT[,HOST:PORT...]' (for example etcd://127.0.0.1:2379; "
    "the port defaults to 2379, IPv6 hosts go in brackets: etcd://[::1]:2379)"
)

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
# (Both are used with fullmatch: "$" would also match before a trailing newline.)
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_ENDPOINT = re.compile(r"(?:\[(?P<ipv6>[^\]]+)\]|(?P<host>[^:\[\]]+))(?::(?P<port>[0-9]{1,5}))?")


class StoreKind(StrEnum):
    MEMORY = "memory"
    ETCD = "etcd"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One etcd member's client address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class StateUrl:
    """A parsed ``--state`` value; ``str()`` gives its canonical form."""

    kind: StoreKind
    endpoints: tuple[Endpoint, ...] = ()

    def __str__(self) -> str:
        if self.kind is StoreKind.MEMORY:
            return "memory"
        return "etcd://" + ",".join(str(e) for e in self.endpoints)


MEMORY = StateUrl(StoreKind.MEMORY)


def parse_state_url(text: str) -> StateUrl:
    """Parse a ``--state`` value; raise ConfigError naming the accepted forms."""
    value = text.strip()
    if value in ("memory", "memory://"):
        return MEMORY
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() != StoreKind.ETCD:
        raise ConfigError(f"invalid state store {text!r}: expected {ACCEPTED_FORMS}")
    if not rest:
        raise ConfigError(
            f"invalid state store {text!r}: no etcd endpoint; expected {ACCEPTED_FORMS}"
        )
    endpoints = tuple(_parse_endpoint(text, part) for part in rest.split(","))
    if len(set(endpoints)) != len(endpoints):
        raise ConfigError(
            f"invalid state store {text!r}: an etcd endpoint is listed twice; "
            f"expected {ACCEPTED_FORMS}"
        )
    return StateUrl(StoreKind.ETCD, endpoints)


def _parse_endpoint(text: str, part: str) -> Endpoint:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"invalid state store {text!r}: {why}; expected {ACCEPTED_FORMS}")

    match = _ENDPOINT.fullmatch(part)
    if match is None:
        raise bad(f"{part!r} is not HOST[:PORT] (no paths, users or queries)")
    port = int(match["port"]) if match["port"] else DEFAULT_ETCD_PORT
    if not 1 <= port <= 65535:
        raise bad(f"port {port} is out of range 1-65535")
    if match["ipv6"] is not None:
        try:
            return Endpoint(str(ipaddress.IPv6Address(match["ipv6"])), port)
        except ValueError:
            raise bad(f"{match['ipv6']!r} is not an IPv6 address") from None
    host = match["host"]
    if host.replace(".", "").isdigit():
        try:
            return Endpoint(str(ipaddress.IPv4Address(host)), port)
        except ValueError:
            raise bad(f"{host!r} is not an IPv4 address") from None
    if not _HOSTNAME.fullmatch(host):
        raise bad(f"{host!r} is not a host name or IPv4 address")
    return Endpoint(host.lower(), port)


def open_store(
    url: StateUrl | str,
    *,
    clock: Clock,
    registry: CollectorRegistry,
    timeout: float | None = None,
) -> StateStore:
    """Open the store ``url`` names. Nothing is contacted yet: an unreachable etcd shows
    up as StateUnavailable on the first call (each call is bounded by ``timeout``
    seconds, default :data:`gtm.state.etcd.DEFAULT_TIMEOUT`).

    The embedded store expires leases lazily on every call; its owner should also run
    :meth:`~gtm.state.memory.MemoryStore.run_expiry` so watchers see expiries promptly.
    """
    parsed = parse_state_url(url) if isinstance(url, str) else url
    if parsed.kind is StoreKind.MEMORY:
        from gtm.state.memory import MemoryStore

        return MemoryStore(clock, registry)
    from gtm.state.etcd import DEFAULT_TIMEOUT, EtcdStore

    return EtcdStore(
        parsed.endpoints, timeout=DEFAULT_TIMEOUT if timeout is None else timeout, registry=registry
    )

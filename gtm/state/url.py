"""``--state`` URLs: which store a process uses, and opening it.

Accepted forms::

    memory                                  the embedded store (single process)
    etcd://HOST[:PORT][,HOST[:PORT]...]     etcd; PORT defaults to 2379, IPv6 as [::1]:2379
    etcd://HOST:PORT?cacert=CA.pem&cert=CLIENT.pem&key=CLIENT-key.pem&user=gtm&password-file=PATH

TLS and authentication go in the query, with etcdctl's option names:

``cacert``
    The CA that signed etcd's server certificate; giving it turns TLS on (there is no
    fallback to plaintext).
``cert`` and ``key``
    A client certificate and its key (both or neither; needs ``cacert``), for etcd's
    ``--client-cert-auth``. Without ``user``, etcd takes the user from the certificate's
    common name.
``user`` and ``password-file``
    etcd user + password authentication. The password is read from ``password-file``
    (first line), else from ``$GTM_ETCD_PASSWORD``; it is never accepted in the URL, so it
    never shows in ``ps`` or shell history.

Parsing is cheap and imports no client library; :func:`open_store` imports the etcd
client only when an etcd URL is opened.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote

from gtm.errors import ConfigError
from gtm.net import HOSTNAME

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gtm.clock import Clock
    from gtm.state.store import StateStore

#: etcd's IANA-registered client port.
DEFAULT_ETCD_PORT = 2379

ACCEPTED_FORMS = (
    "'memory' or 'etcd://HOST:PORT[,HOST:PORT...]' (for example etcd://127.0.0.1:2379; "
    "the port defaults to 2379, IPv6 hosts go in brackets: etcd://[::1]:2379; TLS and "
    "authentication as ?cacert=PATH&cert=PATH&key=PATH&user=NAME&password-file=PATH)"
)

#: Where the etcd password comes from when the URL names a user but no password-file.
PASSWORD_ENV = "GTM_ETCD_PASSWORD"

_QUERY_KEYS = ("cacert", "cert", "key", "user", "password-file")

# Host names as gtm.net.HOSTNAME (RFC 1123); used with fullmatch, as _ENDPOINT is.
_HOSTNAME = HOSTNAME
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
class EtcdTls:
    """TLS to etcd: the CA that signed etcd's certificate, and our client certificate."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True, slots=True)
class EtcdAuth:
    """etcd user authentication; the password is read by :meth:`password`, not stored."""

    user: str
    password_file: Path | None = None

    def password(self, environ: Mapping[str, str] | None = None) -> str:
        """The password from ``password_file`` (first line) or ``$GTM_ETCD_PASSWORD``."""
        if self.password_file is not None:
            try:
                lines = self.password_file.read_text().splitlines()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read the etcd password file {self.password_file}: {exc.strerror}"
                ) from None
            if not lines or not lines[0]:
                raise ConfigError(f"the etcd password file {self.password_file} is empty")
            return lines[0]
        value = (os.environ if environ is None else environ).get(PASSWORD_ENV, "")
        if not value:
            raise ConfigError(
                f"etcd user {self.user!r} needs a password: add password-file=PATH to the "
                f"--state URL or set ${PASSWORD_ENV}"
            )
        return value


@dataclass(frozen=True, slots=True)
class StateUrl:
    """A parsed ``--state`` value; ``str()`` gives its canonical form (no secrets)."""

    kind: StoreKind
    endpoints: tuple[Endpoint, ...] = ()
    tls: EtcdTls | None = None
    auth: EtcdAuth | None = None

    def __str__(self) -> str:
        if self.kind is StoreKind.MEMORY:
            return "memory"
        query = [
            (name, value)
            for name, value in (
                ("cacert", self.tls and self.tls.ca),
                ("cert", self.tls and self.tls.cert),
                ("key", self.tls and self.tls.key),
                ("user", self.auth and self.auth.user),
                ("password-file", self.auth and self.auth.password_file),
            )
            if value
        ]
        text = "etcd://" + ",".join(str(e) for e in self.endpoints)
        if query:
            text += "?" + "&".join(f"{n}={quote(str(v), safe='/.-_~')}" for n, v in query)
        return text


MEMORY = StateUrl(StoreKind.MEMORY)


def parse_state_url(text: str) -> StateUrl:
    """Parse a ``--state`` value; raise ConfigError naming the accepted forms."""
    value = text.strip()
    if value in ("memory", "memory://"):
        return MEMORY
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() != StoreKind.ETCD:
        raise ConfigError(f"invalid state store {text!r}: expected {ACCEPTED_FORMS}")
    hosts, _, query = rest.partition("?")
    if not hosts:
        raise ConfigError(
            f"invalid state store {text!r}: no etcd endpoint; expected {ACCEPTED_FORMS}"
        )
    endpoints = tuple(_parse_endpoint(text, part) for part in hosts.split(","))
    if len(set(endpoints)) != len(endpoints):
        raise ConfigError(
            f"invalid state store {text!r}: an etcd endpoint is listed twice; "
            f"expected {ACCEPTED_FORMS}"
        )
    tls, auth = _parse_query(text, query)
    return StateUrl(StoreKind.ETCD, endpoints, tls, auth)


def _parse_query(text: str, query: str) -> tuple[EtcdTls | None, EtcdAuth | None]:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"invalid state store {text!r}: {why}; expected {ACCEPTED_FORMS}")

    if not query:
        return None, None
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise bad(f"{query!r} is not NAME=VALUE&...") from None
    options: dict[str, str] = {}
    for name, value in pairs:
        if name == "password":
            raise bad(
                "a password never goes in the URL (it would show in ps and shell history): "
                f"use password-file=PATH or ${PASSWORD_ENV}"
            )
        if name not in _QUERY_KEYS:
            raise bad(f"unknown option {name!r} (known: {', '.join(_QUERY_KEYS)})")
        if name in options:
            raise bad(f"option {name!r} is given twice")
        if not value:
            raise bad(f"option {name!r} is empty")
        options[name] = value
    if ("cert" in options) != ("key" in options):
        raise bad("a client certificate needs both cert= and key=")
    if "cert" in options and "cacert" not in options:
        raise bad("cert= and key= need cacert= (the CA that signed etcd's certificate)")
    if "password-file" in options and "user" not in options:
        raise bad("password-file= needs user=")
    tls = None
    if "cacert" in options:
        cert, key = options.get("cert"), options.get("key")
        tls = EtcdTls(
            Path(options["cacert"]), Path(cert) if cert else None, Path(key) if key else None
        )
    auth = None
    if "user" in options:
        password_file = options.get("password-file")
        auth = EtcdAuth(options["user"], Path(password_file) if password_file else None)
    return tls, auth


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
        parsed.endpoints,
        timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
        registry=registry,
        tls=parsed.tls,
        user=parsed.auth.user if parsed.auth else None,
        password=parsed.auth.password() if parsed.auth else None,
    )

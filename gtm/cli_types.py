"""Command-line value types shared by every ``gtm`` command and daemon.

A malformed flag must end a command with one line naming the flag and the accepted form,
and exit status 2 — before anything is started, never as a traceback from deep inside a
tier. Each kind of value is therefore checked once, here, as a :class:`click.ParamType`
whose failure is a :class:`click.BadParameter`; every command uses these instead of a
plain string and a check of its own:

==========================  =======================================================
type                        accepts → returns
==========================  =======================================================
:class:`HostPort`           ``HOST:PORT`` (IPv6 host in brackets; optionally ``off``)
                            → the canonical ``HOST:PORT`` text
:class:`Host`               an IP address or an RFC 1123 host name → itself
:data:`PORT`                0..65535 (0: any free port)
:class:`StateURL`           a ``--state`` URL (:mod:`gtm.state.url`) → its canonical text
:class:`HttpURL`            ``http(s)://HOST[:PORT][/PATH]`` → without a trailing ``/``
:class:`IPAddress`          an IPv4/IPv6 address → :class:`ipaddress.IPv4Address` / ``6``
:class:`IPNetwork`          a network (host bits allowed) → an ``ip_network``
:func:`existing_file` …     paths that must exist (click's own check)
:class:`NewFile`            a file to write, in a directory that exists → its text
==========================  =======================================================

Types return text where the commands' configuration models hold text, so adopting a type
changes only where a bad value is caught. The one-line presentation of the resulting
usage error is the ``gtm`` command's (:mod:`gtmctl.cli`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from gtm.errors import ConfigError
from gtm.net import is_host, split_host_port
from gtm.state.url import ACCEPTED_FORMS, StateUrl, StoreKind, parse_state_url

#: Ports a listener or a client may name (0: the system picks a free one).
PORT = click.IntRange(0, 65535)


def host_port(value: str, *, example: str, ip_only: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` as ``(host, port)``; ConfigError quoting ``value`` and ``example``."""
    host, port = split_host_port(value, example=example)
    if ip_only:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"{host!r} is not an IP address (e.g. {example})") from None
    elif not is_host(host):
        raise ConfigError(f"{host!r} is not a host name or IP address (e.g. {example})")
    return host, port


class HostPort(click.ParamType[str]):
    """A listen or connect address, ``HOST:PORT``; ``off`` too when ``off=True``."""

    name = "HOST:PORT"

    def __init__(
        self, *, example: str = "127.0.0.1:8080", ip_only: bool = False, off: bool = False
    ):
        self.example = example
        self.ip_only = ip_only
        self.off = off

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if self.off and text == "off":
            return text
        try:
            host, port = host_port(text, example=self.example, ip_only=self.ip_only)
        except ConfigError as exc:
            self.fail(f"{exc}{' or off' if self.off else ''}", param, ctx)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Host(click.ParamType[str]):
    """A host to listen on or dial: an IP address or a host name."""

    name = "HOST"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip().strip("[]")
        if not is_host(text):
            self.fail(f"{value!r} is not a host name or IP address", param, ctx)
        return text


class StateURL(click.ParamType[str]):
    """A ``--state`` value: ``memory`` or ``etcd://…`` (see :mod:`gtm.state.url`)."""

    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return str(parse_state_url(str(value)))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "URL"

    @staticmethod
    def accepted() -> str:
        return ACCEPTED_FORMS


class HttpURL(click.ParamType[str]):
    """An ``http://`` or ``https://`` URL with a host (and a valid port, if any)."""

    name = "URL"

    def __init__(self, *, example: str = "http://127.0.0.1:8080") -> None:
        self.example = example

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        why = _url_problem(text)
        if why:
            self.fail(f"{text!r} is not an http(s) URL: {why} (e.g. {self.example})", param, ctx)
        return text.rstrip("/")


def _url_problem(text: str) -> str:
    if any(c.isspace() for c in text):
        return "it contains white space"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http or https"
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "the port is not 0..65535"
    host = parts.hostname or ""
    if not host or not is_host(host):
        return "no valid host"
    return ""


class IPAddress(click.ParamType[ipaddress.IPv4Address | ipaddress.IPv6Address]):
    """An IPv4 or IPv6 address."""

    name = "ADDRESS"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        try:
            return ipaddress.ip_address(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not an IP address", param, ctx)


class IPNetwork(click.ParamType[ipaddress.IPv4Network | ipaddress.IPv6Network]):
    """An IPv4 or IPv6 network, ``ADDRESS/PREFIX`` (host bits allowed) or one address."""

    name = "NETWORK"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        try:
            return ipaddress.ip_network(str(value).strip(), strict=False)
        except ValueError:
            self.fail(f"{value!r} is not a network (e.g. 10.0.0.0/8)", param, ctx)


def shared_store(state: str, *, instead: str) -> StateUrl:
    """``--state`` of a command that reads or writes the store the tiers share: never the
    embedded one, which lives inside one ``gtm up`` process (``instead`` says what to do
    about it)."""
    try:
        url = parse_state_url(state)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--state") from None
    if url.kind is StoreKind.MEMORY:
        raise click.BadParameter(
            f"the embedded store lives inside one `gtm up` process{instead}",
            param_hint="--state",
        )
    return url


_F = TypeVar("_F", bound=Callable[..., Any])


def geoip_reload_interval(default: float) -> Callable[[_F], _F]:
    """``--geoip-reload-interval``, the same option on every tier that reads a GeoIP
    database (``default``: :data:`gtm.geo.DEFAULT_RELOAD_INTERVAL_S`, passed in so that
    this module does not import the geo code)."""
    return click.option(
        "--geoip-reload-interval",
        type=click.FloatRange(0, 86400),
        default=default,
        show_default=True,
        help="Seconds between looks at the --geoip-db file: a new version (install it by "
        "renaming over the file) is loaded and swapped in without dropping a request; one "
        "that does not open leaves the old one serving. 0: never.",
    )


def existing_file(*, as_path: bool = False) -> click.Path:
    """A file that must exist (click says which, in one line)."""
    return click.Path(exists=True, dir_okay=False, path_type=Path if as_path else None)


def existing_dir(*, as_path: bool = False) -> click.Path:
    """A directory that must exist."""
    return click.Path(exists=True, file_okay=False, path_type=Path if as_path else None)


def existing_path(*, as_path: bool = False) -> click.Path:
    """A file or directory that must exist."""
    return click.Path(exists=True, path_type=Path if as_path else None)


class NewFile(click.ParamType[str]):
    """A file the command will write (at its end, say): its directory must exist now, so
    a typo fails before the work rather than after it."""

    name = "FILE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        path = Path(str(value))
        if path.is_dir():
            self.fail(f"{str(value)!r} is a directory", param, ctx)
        if not path.parent.is_dir():
            self.fail(f"{str(path.parent)!r}: no such directory", param, ctx)
        return str(value)

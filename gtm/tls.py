"""Mutual TLS between the tiers: configuration, SSL contexts, peer identities, reload.

Identities
    Every gtm process has one identity ``KIND/NAME`` — ``global/<name>``,
    ``region/<region>``, ``zone/<zone>``, ``gpu/<worker>``, ``ops/<name>`` (operators'
    tools) — carried in its certificate as a URI subject alternative name in the SPIFFE
    form ``spiffe://gtm/KIND/NAME`` (SPIFFE ID: ``spiffe://<trust domain>/<path>``, trust
    domain ``gtm``; github.com/spiffe/spiffe, standards/X509-SVID.md). A URI SAN, not a
    DNS SAN, because an identity says *what* a peer is, not *where* it is: the same
    certificate works on any address, and a DNS name could be confused with a real
    host name by ordinary hostname checking.

Verification
    Python's ``ssl`` verifies the chain (CA, validity dates) but cannot match URI SANs.
    So contexts made here are :class:`GtmSSLContext`, whose ``sslobject_class`` checks
    the peer's identity against the configured patterns as the last step of the
    handshake, on both sides: a server refuses a client whose certificate is from the
    CA but names the wrong identity, and a client refuses such a server. The refusal is
    a :class:`PeerIdentityError` (an ``ssl.SSLCertVerificationError``, so aiohttp raises
    ``ClientConnectorCertificateError``) and a WARNING log naming both identities.
    Hostname checking is off: the identity replaces it (as in SPIFFE).
    Patterns are shell-style (``fnmatch``): ``region/*``, ``zone/eu-west-*``.

No plaintext fallback
    A TLS listener only speaks TLS (a plaintext request fails the handshake), and a
    client session made with :func:`client_session_options` refuses ``http://`` URLs
    with :class:`PlaintextRefused` instead of connecting in the clear.

Reload
    :class:`TlsMaterial` owns the contexts it made. :meth:`TlsMaterial.run` (on a
    supervised task, through the injected clock) checks the files' mtimes and sizes every
    ``interval`` seconds; on a change it first loads them into a scratch context (a
    half-written file or a certificate that does not match its key is logged and retried,
    never half-applied), then into every live context, so new handshakes present the
    new certificate without a restart. A new CA file is *added* to the trusted set
    (OpenSSL cannot remove a trust anchor from a live context): removing an old CA
    needs a restart, which is what a CA rotation's overlap period wants anyway.

Expiry
    ``gtm_tls_certificate_expiry_seconds{role,identity}`` — seconds until ``notAfter``
    of this process's certificate (role ``certificate``) and of the CA (role ``ca``),
    refreshed every check — and a WARNING log when one is less than
    :data:`EXPIRY_WARNING_DAYS` days from expiry. The same ``notAfter`` as a Unix
    timestamp, ``gtm_tls_cert_expiry_timestamp_seconds{cert,identity}`` (``cert``: the
    role), is what alerts compare with ``time()``: it does not move between checks.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import click
from prometheus_client import CollectorRegistry, Gauge

from gtm.clock import Clock
from gtm.errors import ConfigError, GtmError

log = logging.getLogger(__name__)

#: The SPIFFE trust domain of gtm identities.
TRUST_DOMAIN = "gtm"
_URI_PREFIX = f"spiffe://{TRUST_DOMAIN}/"

#: Warn this many days before a certificate expires (the issue's threshold; also what
#: cert-manager's default renewBefore of 1/3 of a 90-day certificate comes to).
EXPIRY_WARNING_DAYS = 30

#: How often a running process looks for new certificate files, seconds. A rotation tool
#: (cert-manager, a cron job) replaces files well ahead of expiry, so a minute is plenty.
DEFAULT_RELOAD_INTERVAL = 60.0

#: KIND/NAME: a kind of lower-case letters, a name of letters, digits, ".", "_", "-".
_IDENTITY = re.compile(r"[a-z]+/[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PATTERN = re.compile(r"[a-z*?]+/[A-Za-z0-9._*?\[\]!-]{1,128}")


class TlsError(GtmError):
    """A TLS file cannot be loaded (the message names the file and what to check)."""


class PeerIdentityError(ssl.SSLCertVerificationError, GtmError):
    """The peer's certificate is from our CA but does not name an expected identity."""


class PlaintextRefused(aiohttp.ClientConnectionError, GtmError):
    """A TLS-configured client was asked to dial an ``http://`` URL."""


class Side(StrEnum):
    """Which end of a connection a context is for."""

    SERVER = "server"
    CLIENT = "client"


def identity_uri(identity: str) -> str:
    """``region/eu-west`` → ``spiffe://gtm/region/eu-west``; ConfigError if malformed."""
    if not _IDENTITY.fullmatch(identity):
        raise ConfigError(
            f"invalid TLS identity {identity!r}: expected KIND/NAME such as region/eu-west"
        )
    return _URI_PREFIX + identity


def peer_identities(peercert: Any) -> tuple[str, ...]:
    """The gtm identities (``KIND/NAME``) in a ``getpeercert()`` dictionary."""
    if not isinstance(peercert, dict):
        return ()
    found: list[str] = []
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "URI" and isinstance(value, str) and value.startswith(_URI_PREFIX):
            found.append(value.removeprefix(_URI_PREFIX))
    return tuple(found)


def matches(identities: Iterable[str], patterns: Sequence[str]) -> str | None:
    """The first identity matching one of ``patterns`` (case-sensitive), else None."""
    for identity in identities:
        if any(fnmatch.fnmatchcase(identity, p) for p in patterns):
            return identity
    return None


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Where a process's TLS material is and whom it accepts.

    ``peers``: identity patterns a server must present when this process dials it.
    ``clients``: identity patterns a client must present when this process serves it;
    empty accepts any certificate signed by the CA. Empty ``peers`` likewise accepts any
    CA-signed server (the tiers always pass their defaults).
    """

    ca: Path
    cert: Path
    key: Path
    peers: tuple[str, ...] = ()
    clients: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern in (*self.peers, *self.clients):
            if not _PATTERN.fullmatch(pattern):
                raise ConfigError(
                    f"invalid TLS identity pattern {pattern!r}: expected KIND/NAME with "
                    "shell wildcards, such as region/* or zone/eu-west-*"
                )

    @classmethod
    def from_options(
        cls,
        *,
        ca: str | Path | None,
        cert: str | Path | None,
        key: str | Path | None,
        peers: Sequence[str] = (),
        clients: Sequence[str] = (),
    ) -> TlsConfig | None:
        """From ``--tls-ca/--tls-cert/--tls-key``: None when none is given, ConfigError
        naming the missing ones when only some are (never a silent plaintext)."""
        given = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key}
        if not any(given.values()):
            return None
        missing = [name for name, value in given.items() if not value]
        if missing:
            raise ConfigError(
                "TLS needs --tls-ca, --tls-cert and --tls-key together; "
                f"missing {', '.join(missing)}"
            )
        return cls(Path(str(ca)), Path(str(cert)), Path(str(key)), tuple(peers), tuple(clients))


class _CheckedSSLObject(ssl.SSLObject):
    """Checks the peer's gtm identity once the chain has been verified (see module doc)."""

    def do_handshake(self) -> None:
        super().do_handshake()  # raises SSLWantReadError until the handshake is done
        context = self.context
        if isinstance(context, GtmSSLContext) and context.gtm_patterns:
            check_peer(self.getpeercert(), context.gtm_patterns, context.gtm_side)


class GtmSSLContext(ssl.SSLContext):
    """An SSLContext that also checks the peer's gtm identity during the handshake."""

    sslobject_class = _CheckedSSLObject
    gtm_patterns: tuple[str, ...] = ()
    gtm_side: Side = Side.CLIENT


def check_peer(peercert: Any, patterns: Sequence[str], side: Side) -> str:
    """The peer's matching identity; PeerIdentityError (and a WARNING log) if none."""
    identities = peer_identities(peercert)
    found = matches(identities, patterns)
    if found is not None:
        return found
    who = "client" if side is Side.SERVER else "server"
    shown = ", ".join(identities) or "no spiffe://gtm/ URI SAN"
    message = (
        f"TLS {who} identity refused: its certificate names {shown}; "
        f"expected {' or '.join(patterns)}"
    )
    log.warning("%s", message)
    raise PeerIdentityError(message)


def _load_chain(context: ssl.SSLContext, config: TlsConfig) -> None:
    try:
        context.load_cert_chain(config.cert, config.key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(
            f"cannot load TLS certificate {config.cert} with key {config.key}: {exc} "
            "(check both files exist, are PEM, and that the key belongs to the certificate)"
        ) from exc


def _load_ca(context: ssl.SSLContext, config: TlsConfig) -> None:
    try:
        context.load_verify_locations(cafile=config.ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(
            f"cannot load TLS CA {config.ca}: {exc} (check it exists and holds PEM certificates)"
        ) from exc


def build_context(config: TlsConfig, side: Side, *, client_certs: bool = True) -> GtmSSLContext:
    """A context for ``side``: TLS ≥ 1.2, our certificate, the CA, peers verified.

    ``client_certs=False`` only for a server facing end users (the front door): it then
    asks for no client certificate and checks no client identity.
    """
    protocol = ssl.PROTOCOL_TLS_SERVER if side is Side.SERVER else ssl.PROTOCOL_TLS_CLIENT
    context = GtmSSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.gtm_side = side
    _load_chain(context, config)
    if side is Side.CLIENT:
        context.check_hostname = False  # the identity check replaces it (module doc)
        context.verify_mode = ssl.CERT_REQUIRED
        context.gtm_patterns = config.peers
        _load_ca(context, config)
    elif client_certs:
        context.verify_mode = ssl.CERT_REQUIRED
        context.gtm_patterns = config.clients
        _load_ca(context, config)
    return context


@dataclass(frozen=True, slots=True)
class CertInfo:
    """What the expiry gauge and logs need from a certificate."""

    identity: str
    not_after: float  # Unix time


def cert_info(path: Path) -> CertInfo:
    """The first certificate in a PEM file: its gtm identity (or subject) and notAfter."""
    # Imported here: only a process with TLS on reads certificates (the x509 layer is
    # a large import), and it does so at start-up (TlsMaterial), so a broken install
    # still fails there, not on a later reload.
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise TlsError(f"cannot read certificate {path}: {exc}") from exc
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    ours = [u.removeprefix(_URI_PREFIX) for u in uris if u.startswith(_URI_PREFIX)]
    identity = ours[0] if ours else cert.subject.rfc4514_string()
    return CertInfo(identity, cert.not_valid_after_utc.timestamp())


def _stamp(config: TlsConfig) -> tuple[tuple[int, int, int], ...]:
    # Inode too: rotation tools write a new file and rename it over the old one.
    stamps = []
    for path in (config.ca, config.cert, config.key):
        try:
            st = os.stat(path)
        except OSError:
            stamps.append((-1, -1, -1))
        else:
            stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(stamps)


class TlsMaterial:
    """One process's TLS files, the contexts made from them, reload and expiry gauge."""

    def __init__(self, config: TlsConfig, *, clock: Clock, registry: CollectorRegistry) -> None:
        self.config = config
        self._clock = clock
        self._contexts: list[GtmSSLContext] = []
        self._gauge = Gauge(
            "gtm_tls_certificate_expiry_seconds",
            "Seconds until this process's TLS certificate (role=certificate) or its CA "
            "(role=ca) expires; negative once expired.",
            ["role", "identity"],
            registry=registry,
        )
        self._expiry = Gauge(
            "gtm_tls_cert_expiry_timestamp_seconds",
            "Unix time at which this process's TLS certificate (cert=certificate) or its "
            "CA (cert=ca) expires (notAfter).",
            ["cert", "identity"],
            registry=registry,
        )
        self._warned: set[tuple[str, float]] = set()
        self._infos: dict[str, CertInfo] = {}
        self._stamp = _stamp(config)
        self._read_infos()  # fails fast (TlsError) on unreadable files at start-up
        self.check_expiry()

    @property
    def identity(self) -> str:
        return self._infos["certificate"].identity

    def server_context(self, *, client_certs: bool = True) -> GtmSSLContext:
        return self._track(build_context(self.config, Side.SERVER, client_certs=client_certs))

    def client_context(self) -> GtmSSLContext:
        return self._track(build_context(self.config, Side.CLIENT))

    def _track(self, context: GtmSSLContext) -> GtmSSLContext:
        self._contexts.append(context)
        return context

    def _read_infos(self) -> None:
        infos = {"certificate": cert_info(self.config.cert), "ca": cert_info(self.config.ca)}
        for role, old in self._infos.items():
            self._gauge.remove(role, old.identity)
            self._expiry.remove(role, old.identity)
        self._infos = infos

    def check_expiry(self) -> None:
        """Refresh the gauge; WARNING once per certificate when it nears expiry."""
        now = self._clock.wall()
        for role, info in self._infos.items():
            left = info.not_after - now
            self._gauge.labels(role, info.identity).set(left)
            self._expiry.labels(role, info.identity).set(info.not_after)
            key = (info.identity, info.not_after)
            if left < EXPIRY_WARNING_DAYS * 86400 and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "TLS %s %s (%s) expires in %.1f days: replace it (gtm reloads it "
                    "without a restart)",
                    role,
                    info.identity,
                    self.config.cert if role == "certificate" else self.config.ca,
                    left / 86400,
                )

    def reload_if_changed(self) -> bool:
        """Reload every context if the files changed; True if it did. A set of files
        that does not load is logged and left for the next check (old ones stay)."""
        stamp = _stamp(self.config)
        if stamp == self._stamp:
            return False
        try:
            scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            _load_chain(scratch, self.config)
            _load_ca(scratch, self.config)
            self._read_infos()
        except TlsError as exc:
            log.warning("TLS files changed but do not load yet, keeping the old ones: %s", exc)
            return False
        for context in self._contexts:
            _load_chain(context, self.config)
            if context.verify_mode == ssl.CERT_REQUIRED:
                _load_ca(context, self.config)
        self._stamp = stamp
        log.info("reloaded TLS certificate %s (%s)", self.config.cert, self.identity)
        self.check_expiry()
        return True

    async def run(self, interval: float = DEFAULT_RELOAD_INTERVAL) -> None:
        """Check for new files and refresh the gauge every ``interval`` seconds, forever."""
        while True:
            await self._clock.sleep(interval)
            try:
                if not self.reload_if_changed():
                    self.check_expiry()
            except TlsError as exc:  # files changed again mid-reload: next round
                log.warning("TLS reload failed, retrying in %.0f s: %s", interval, exc)


async def _refuse_plaintext(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestStartParams,
) -> None:
    if params.url.scheme != "https":
        raise PlaintextRefused(
            f"refusing {params.url.scheme}:// to {params.url.host}:{params.url.port}: TLS is "
            "configured, so peers must be https:// (no plaintext fallback)"
        )


def client_session_options(context: ssl.SSLContext | None) -> dict[str, Any]:
    """Keyword arguments for ``aiohttp.ClientSession`` adding the TLS refusal of
    ``http://``; with ``context=None`` (no TLS) an empty dict. Pass the same context
    to the session's ``TCPConnector(ssl=...)``."""
    if context is None:
        return {}
    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(_refuse_plaintext)
    return {"trace_configs": [trace]}


def connector_ssl(context: ssl.SSLContext | None) -> ssl.SSLContext | bool:
    """The ``ssl=`` argument of ``aiohttp.TCPConnector`` (True: aiohttp's default)."""
    return True if context is None else context


def scheme(context: ssl.SSLContext | None) -> str:
    """The URL scheme a server with this context advertises."""
    return "http" if context is None else "https"


# ---------------------------------------------------------------------------- CLI

#: The identity patterns each tier expects by default (``--tls-peer`` / ``--tls-client``):
#: who dials whom in ARCHITECTURE.md §1. ``ops/*`` are operators' tools (Prometheus,
#: ``gtm up``'s status page, curl with an ops certificate).
DEFAULT_PEERS: Mapping[str, tuple[str, ...]] = {
    "global": ("region/*",),
    "regional": ("zone/*", "region/*"),  # its zones, and peer regions for spillover
    "zone": ("gpu/*",),
    "gpu": (),
}
DEFAULT_CLIENTS: Mapping[str, tuple[str, ...]] = {
    "global": (),
    "regional": ("global/*", "region/*", "ops/*"),
    "zone": ("region/*", "ops/*"),
    "gpu": ("zone/*", "ops/*"),
}

_F = Callable[..., Any]


def click_options(tier: str) -> Callable[[_F], _F]:
    """``--tls-ca/--tls-cert/--tls-key`` (env ``GTM_TLS_CA/CERT/KEY``) and the identity
    patterns ``--tls-peer``/``--tls-client`` with ``tier``'s defaults."""
    path = click.Path(dir_okay=False)
    options = [
        click.option(
            "--tls-ca",
            envvar="GTM_TLS_CA",
            type=path,
            help="CA (PEM) that signs the tiers' certificates. With --tls-cert and --tls-key: "
            "mutual TLS on every listener and connection between tiers, no plaintext.",
        ),
        click.option(
            "--tls-cert",
            envvar="GTM_TLS_CERT",
            type=path,
            help="This process's certificate (PEM) with a spiffe://gtm/KIND/NAME URI SAN; "
            "reloaded without a restart when the file changes.",
        ),
        click.option("--tls-key", envvar="GTM_TLS_KEY", type=path, help="Its private key (PEM)."),
    ]
    if DEFAULT_PEERS[tier] or tier == "global":
        options.append(
            click.option(
                "--tls-peer",
                multiple=True,
                default=DEFAULT_PEERS[tier],
                show_default=True,
                help="Identity (KIND/NAME, shell wildcards) a server this process dials must "
                "present. Repeatable.",
            )
        )
    if DEFAULT_CLIENTS[tier]:
        options.append(
            click.option(
                "--tls-client",
                multiple=True,
                default=DEFAULT_CLIENTS[tier],
                show_default=True,
                help="Identity a client must present to be served. Repeatable.",
            )
        )

    def decorate(command: _F) -> _F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def config_from_options(options: Mapping[str, Any]) -> TlsConfig | None:
    """The TlsConfig of :func:`click_options`' values (None when TLS is off)."""
    return TlsConfig.from_options(
        ca=options.get("tls_ca"),
        cert=options.get("tls_cert"),
        key=options.get("tls_key"),
        peers=tuple(options.get("tls_peer") or ()),
        clients=tuple(options.get("tls_client") or ()),
    )


def material(
    config: TlsConfig | None, *, clock: Clock, registry: CollectorRegistry
) -> TlsMaterial | None:
    """:class:`TlsMaterial` for ``config`` (None when TLS is off)."""
    return None if config is None else TlsMaterial(config, clock=clock, registry=registry)

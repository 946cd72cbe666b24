"""Who may tell a tier what: the signed tier header, and where a client's location came from.

**Tier authentication.** A tier that sends a request on to another (the front door to a
regional LB, a regional LB spilling to a peer) signs it: ``x-gtm-tier-auth`` is
``v1;<issuer>;<unix ms>;<hex HMAC-SHA256>`` over the issuer, the time, the request id
(``x-request-id``) and every other ``x-gtm-`` request header it sends (the client's
location among them), with the key the tiers share — the secret the regional LBs already
shared as their peer token (``--peer-token``, env ``GTM_PEER_TOKEN``), now given to the
front door too: one secret, not a second one. The key never travels; HMAC-SHA256
(RFC 2104) is compared in constant time. A receiving tier believes the ``x-gtm-``
headers of a request only when :func:`inbound` says its signature is valid and fresh
(:data:`MAX_AGE_S`, either way, for clock skew); a request that carries the key itself
in ``x-gtm-peer-token`` (regional LBs before this header) is believed as well, and so is
one over an mTLS connection whose client certificate names the front door or a regional
LB (``global/*``, ``region/*``: :mod:`gtm.tls`).
Anything else — no signature, a bad one, a stale one, no key configured — is a client:
its tier-only headers are dropped (:func:`gtm.headers.from_untrusted`) and the drop is
reported to the caller, who counts it. A signature binds the request id and the time,
so one seen on the wire replays only for that request id and only briefly; the
inter-tier hops are meant to run over mTLS (``gtm up --tls``), where it cannot be seen.

**Client location.** :class:`ClientLocation` is a country (or none) and its
:class:`LocationOrigin`: located here from the peer's address (``geoip``), from the
address a trusted proxy put in ``X-Forwarded-For`` (``trusted-proxy-xff``), asserted by
a signed upstream tier (``signed-upstream``), or not found — then the policy's
``unknown_client_location`` decides (``unknown-policy``), in the residency engine,
the one home of that rule for every tier. Audit records carry the origin.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from multidict import CIMultiDict, CIMultiDictProxy

from gtm import headers as h
from gtm.geo import GeoLocator, IPAddress, IPNetwork, Location, client_address
from policies.types import is_country_code

#: How old (or how far in the future) a signature may be, s. A spilled request is
#: signed again at each hop, so this bounds clock skew between tiers plus one hop's
#: wait before its headers are read (they are read on arrival).
MAX_AGE_S = 30.0
VERSION = "v1"
#: The environment variable every tier's command reads the key from (``--peer-token``).
TIER_KEY_ENV = "GTM_PEER_TOKEN"
#: The issuer of a front door's signature; a regional LB signs as ``region/<id>``.
GLOBAL_ISSUER = "global"
_ISSUER = re.compile(r"^(global|region/[a-z0-9][a-z0-9-]{0,62})$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_CONTEXT = b"gtm-tier-auth/v1\n"


class LocationOrigin(StrEnum):
    """Where a client's location came from (audit records carry it)."""

    #: The peer's own address, located with this tier's GeoIP database and map.
    GEOIP = "geoip"
    #: The address a trusted proxy appended to ``X-Forwarded-For``, located here.
    TRUSTED_PROXY_XFF = "trusted-proxy-xff"
    #: Asserted by an authenticated upstream tier (the front door or a peer region).
    SIGNED_UPSTREAM = "signed-upstream"
    #: Not found: the policy's ``unknown_client_location`` decides.
    UNKNOWN_POLICY = "unknown-policy"


@dataclass(frozen=True, slots=True)
class ClientLocation:
    """A client's country (``None``: unknown, the policy decides) and where it came from."""

    country: str | None
    origin: LocationOrigin
    #: For ``signed-upstream``: how the upstream tier found it.
    upstream: LocationOrigin | None = None

    @property
    def forwarded_origin(self) -> LocationOrigin:
        """The origin to assert to the next tier: how the location was first found."""
        return self.upstream if self.upstream is not None else self.origin


def from_location(location: Location | None, *, via_proxy: bool) -> ClientLocation:
    """A locator's answer as a :class:`ClientLocation` (``via_proxy``: the address was
    taken from a trusted proxy's ``X-Forwarded-For``)."""
    if location is None or location.country is None:
        return ClientLocation(None, LocationOrigin.UNKNOWN_POLICY)
    origin = LocationOrigin.TRUSTED_PROXY_XFF if via_proxy else LocationOrigin.GEOIP
    return ClientLocation(location.country, origin)


def client_of(
    peer: str | None, forwarded_for: str | None, trusted: Iterable[IPNetwork]
) -> tuple[IPAddress | None, bool]:
    """The client's address as the front door finds it (:func:`gtm.geo.client_address`),
    and whether it came from a trusted proxy's ``X-Forwarded-For``."""
    address = client_address(peer, forwarded_for, trusted)
    return address, address is not None and address != _peer_address(peer)


def locate_peer(
    peer: str | None,
    forwarded_for: str | None,
    trusted: Iterable[IPNetwork],
    locator: GeoLocator,
) -> ClientLocation:
    """Locate a request's client from the connection itself, as the front door does."""
    address, via_proxy = client_of(peer, forwarded_for, trusted)
    if address is None:
        return ClientLocation(None, LocationOrigin.UNKNOWN_POLICY)
    return from_location(locator.locate(address), via_proxy=via_proxy)


def _peer_address(peer: str | None) -> IPAddress | None:
    try:
        return ipaddress.ip_address((peer or "").partition("%")[0])
    except ValueError:
        return None


# ---------------------------------------------------------------------------- signing


class AuthResult(StrEnum):
    """What a request's ``x-gtm-tier-auth`` came to (metric labels)."""

    VALID = "valid"
    #: The key itself in ``x-gtm-peer-token`` (a regional LB before signatures).
    PEER_TOKEN = "peer-token"
    ABSENT = "absent"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad-signature"
    STALE = "stale"
    #: A signature arrived but this tier has no key to check it with.
    NO_KEY = "no-key"
    #: No valid signature, but the connection's mTLS certificate names a tier
    #: (``global/*`` or ``region/*``, :mod:`gtm.tls`).
    MTLS_IDENTITY = "mtls-identity"

    @property
    def trusted(self) -> bool:
        return self in (AuthResult.VALID, AuthResult.PEER_TOKEN, AuthResult.MTLS_IDENTITY)


@dataclass(frozen=True, slots=True)
class Inbound:
    """A request's headers as a tier may believe them."""

    result: AuthResult
    #: Who signed (``global``, ``region/<id>``); ``None`` unless trusted by signature.
    issuer: str | None
    #: The headers, without the tier-only ones when the sender is not a proven tier.
    headers: Mapping[str, str]
    #: The tier-only headers that were dropped (lower case, sorted).
    dropped: tuple[str, ...] = ()

    @property
    def trusted(self) -> bool:
        return self.result.trusted

    @property
    def from_region(self) -> bool:
        """Whether a peer regional LB sent it (a spill: charged at its origin)."""
        if self.result is AuthResult.PEER_TOKEN:
            return True
        return self.trusted and (self.issuer or "").startswith("region/")


class TierKey:
    """The tiers' shared secret: signs outgoing requests, checks incoming ones."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the tier key is empty")
        self._secret = secret.encode()

    def __repr__(self) -> str:
        return "TierKey(<secret>)"

    def _digest(self, issuer: str, stamp: str, headers: Mapping[str, str]) -> str:
        message = bytearray(_CONTEXT)
        message += f"{issuer}\n{stamp}\n{headers.get(h.REQUEST_ID, '')}\n".encode()
        for name, value in signed_items(headers):
            message += f"{name}:{value}\n".encode()
        return hmac.new(self._secret, bytes(message), hashlib.sha256).hexdigest()

    def sign(self, headers: CIMultiDict[str], *, issuer: str, now: float) -> None:
        """Add ``x-gtm-tier-auth`` to outgoing ``headers`` (set everything else first;
        a previous signature or peer token in them is removed)."""
        if not _ISSUER.match(issuer):
            raise ValueError(f"issuer {issuer!r} is not 'global' or 'region/<id>'")
        headers.popall(h.TIER_AUTH, None)
        headers.popall(h.PEER_TOKEN, None)
        stamp = str(int(now * 1000))
        digest = self._digest(issuer, stamp, headers)
        headers[h.TIER_AUTH] = f"{VERSION};{issuer};{stamp};{digest}"

    def check(self, headers: Mapping[str, str], *, now: float) -> tuple[AuthResult, str | None]:
        """Whether ``headers`` come from a tier holding this key, and which one."""
        offered = headers.get(h.PEER_TOKEN)
        if offered is not None and hmac.compare_digest(self._secret, offered.encode()):
            return AuthResult.PEER_TOKEN, None
        value = headers.get(h.TIER_AUTH)
        if value is None:
            return AuthResult.ABSENT, None
        parts = value.strip().split(";")
        if len(parts) != 4 or parts[0] != VERSION or not parts[2].isdigit():
            return AuthResult.MALFORMED, None
        _, issuer, stamp, digest = parts
        if not _ISSUER.match(issuer) or not _DIGEST.match(digest) or len(stamp) > 16:
            return AuthResult.MALFORMED, None
        expected = self._digest(issuer, stamp, headers)
        if not hmac.compare_digest(expected, digest):
            return AuthResult.BAD_SIGNATURE, None
        if abs(now - int(stamp) / 1000) > MAX_AGE_S:
            return AuthResult.STALE, None
        return AuthResult.VALID, issuer


def signed_items(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The ``x-gtm-`` headers a signature covers, canonical: lower-case names sorted,
    repeated values joined with a comma in order, the signature and peer token left out."""
    found: dict[str, list[str]] = {}
    items = headers.items()
    for name, value in items:
        lowered = name.lower()
        if lowered.startswith(h.PREFIX) and lowered not in (h.TIER_AUTH, h.PEER_TOKEN):
            found.setdefault(lowered, []).append(value.strip())
    return sorted((name, ",".join(values)) for name, values in found.items())


def inbound(
    headers: Mapping[str, str],
    key: TierKey | None,
    *,
    now: float,
    identities: Iterable[str] = (),
) -> Inbound:
    """``headers`` as a tier may believe them: all of them from a proven tier, without
    the tier-only ones (:func:`gtm.headers.from_untrusted`) from anyone else.
    ``identities``: the gtm identities of the connection's mTLS client certificate
    (``KIND/NAME``, :func:`gtm.tls.peer_identities`); a front door's or a regional LB's
    proves a tier as a signature does."""
    tier_only = h.from_untrusted(headers.keys())
    if key is None:
        result = AuthResult.NO_KEY if h.TIER_AUTH in tier_only else AuthResult.ABSENT
        issuer = None
    else:
        result, issuer = key.check(headers, now=now)
    if not result.trusted:
        tier = tier_identity(identities)
        if tier is not None:
            result, issuer = AuthResult.MTLS_IDENTITY, tier
    if result.trusted or not tier_only:
        return Inbound(result, issuer, headers)
    kept: CIMultiDict[str] = CIMultiDict(
        (name, value) for name, value in headers.items() if name.lower() not in tier_only
    )
    return Inbound(result, None, CIMultiDictProxy(kept), tuple(sorted(tier_only)))


def tier_identity(identities: Iterable[str]) -> str | None:
    """The issuer an mTLS identity stands for: ``global`` for ``global/<name>``,
    ``region/<id>`` for itself; ``None`` for any other kind (zones, ops, GPUs)."""
    for identity in identities:
        kind, _, name = identity.partition("/")
        if kind == "global" and name:
            return GLOBAL_ISSUER
        if kind == "region" and _ISSUER.match(identity):
            return identity
    return None


def asserted_location(headers: Mapping[str, str]) -> ClientLocation | None:
    """The location a proven tier asserted in ``headers`` (``None``: it asserted none —
    an older front door always sent a country when it had one). Call on the headers
    :func:`inbound` kept for a trusted sender only."""
    country = headers.get(h.CLIENT_COUNTRY, "").strip().upper() or None
    if country is not None and not is_country_code(country):
        return None  # a garbled assertion: locate the client here instead
    raw = headers.get(h.LOCATION_SOURCE, "").strip().lower()
    try:
        upstream: LocationOrigin | None = LocationOrigin(raw) if raw else None
    except ValueError:
        upstream = None
    if country is None and upstream is None:
        return None
    if country is None:
        upstream = LocationOrigin.UNKNOWN_POLICY
    return ClientLocation(country, LocationOrigin.SIGNED_UPSTREAM, upstream)


def assert_location(headers: CIMultiDict[str], location: ClientLocation) -> None:
    """Put ``location`` in outgoing ``headers`` for the next tier (sign afterwards)."""
    headers.popall(h.CLIENT_COUNTRY, None)
    headers.popall(h.LOCATION_SOURCE, None)
    if location.country is not None:
        headers[h.CLIENT_COUNTRY] = location.country
    headers[h.LOCATION_SOURCE] = location.forwarded_origin.value


__all__ = [
    "GLOBAL_ISSUER",
    "MAX_AGE_S",
    "TIER_KEY_ENV",
    "AuthResult",
    "ClientLocation",
    "Inbound",
    "LocationOrigin",
    "TierKey",
    "assert_location",
    "asserted_location",
    "client_of",
    "from_location",
    "inbound",
    "locate_peer",
    "signed_items",
    "tier_identity",
]

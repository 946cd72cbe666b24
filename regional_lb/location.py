"""Who sent a request, and where its client is, at the regional tier.

A regional LB admits requests from the front door, from peer regions that spill, and
from clients that reach it directly (the address ``<region>.api`` answers, or one a
resolver cached before a policy change). So it establishes every client's location
itself, with the front door's own rules (:mod:`gtm.geo`, :mod:`gtm.trust`):

1. the request's ``x-gtm-`` headers are believed only from a proven tier
   (:func:`gtm.trust.inbound`: a valid, fresh ``x-gtm-tier-auth``, or an mTLS client
   certificate naming the front door or a regional LB); from anyone else
   the tier-only ones are dropped and counted (``gtm_regional_untrusted_headers_total``);
   every check's result is counted (``gtm_regional_tier_auth_total``);
2. a proven tier's asserted location is taken as it is (``signed-upstream``);
3. otherwise the client is located here: the peer's address, or the rightmost untrusted
   ``X-Forwarded-For`` entry when the peer is a trusted proxy, looked up in the same
   GeoIP database and geo map as the front door's (``geoip``/``trusted-proxy-xff``);
4. not found: the country is unknown and the policy's ``unknown_client_location``
   decides in the residency engine, exactly as at the front door (``unknown-policy``).

Where each location came from is counted (``gtm_regional_client_location_total``) and
written into the audit records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm import headers as h
from gtm.clock import Clock
from gtm.geo import (
    CachedLocator,
    ChainLocator,
    GeoLocator,
    IPNetwork,
    ReloadingDatabase,
    ReloadOutcome,
)
from gtm.tls import peer_identities
from gtm.trust import (
    ClientLocation,
    Inbound,
    TierKey,
    asserted_location,
    inbound,
    locate_peer,
)

FORWARDED_FOR = "X-Forwarded-For"


class ClientLocator:
    """One replica's view of who sent a request and where its client is."""

    def __init__(
        self,
        *,
        region: str,
        key: TierKey | None,
        locator: GeoLocator | None,
        trusted_proxies: Sequence[IPNetwork],
        clock: Clock,
        registry: CollectorRegistry,
    ) -> None:
        self._issuer = f"region/{region}"
        self._key = key
        #: Without a database the special-purpose map alone: every public address is
        #: unknown and the policy decides (the CLI always opens the database).
        self._locator = locator if locator is not None else ChainLocator(None)
        self._trusted = tuple(trusted_proxies)
        self._clock = clock
        self._cached = CachedLocator(self._locator)
        Gauge(
            "gtm_regional_location_cache_entries",
            "Client addresses whose location is remembered (bounded, least recently "
            "used dropped first).",
            registry=registry,
        ).set_function(lambda: len(self._cached))
        self.auth = Counter(
            "gtm_regional_tier_auth_total",
            "Requests by what their tier signature came to (valid, peer-token, absent, "
            "malformed, bad-signature, stale, no-key).",
            ["result"],
            registry=registry,
        )
        self.untrusted = Counter(
            "gtm_regional_untrusted_headers_total",
            "Tier-only x-gtm- headers dropped from senders that are not a proven tier.",
            ["header"],
            registry=registry,
        )
        self.located = Counter(
            "gtm_regional_client_location_total",
            "Admitted requests by where their client's location came from.",
            ["source"],
            registry=registry,
        )
        self.geoip_reloads = Counter(
            "gtm_regional_geoip_reloads_total",
            "New versions of the --geoip-db file: swapped in (reloaded), or left out "
            "because they did not open (failed; the loaded database keeps serving).",
            ["outcome"],
            registry=registry,
        )
        for outcome in ReloadOutcome:
            self.geoip_reloads.labels(outcome.value)
        #: The --geoip-db followed for new versions (None: a fixed database).
        self.database: ReloadingDatabase | None = None
        if isinstance(self._locator, ChainLocator) and isinstance(
            self._locator.database, ReloadingDatabase
        ):
            self.database = self._locator.database

    async def poll_database(self) -> None:
        """Look for a new GeoIP database (at most once its interval: the front door's
        rule, :class:`gtm.geo.ReloadingDatabase`); after a reload, forget every location
        found with the old one."""
        if self.database is None:
            return
        outcome = self.database.poll()
        if outcome is None:
            return
        self.geoip_reloads.labels(outcome.value).inc()
        if outcome is ReloadOutcome.RELOADED:
            self._cached.clear()

    @property
    def key(self) -> TierKey | None:
        return self._key

    def inbound(self, request: web.Request) -> Inbound:
        """The request's headers as this tier may believe them (counted)."""
        identities: tuple[str, ...] = ()
        transport = request.transport
        if transport is not None:  # an mTLS client certificate naming a tier proves one
            identities = peer_identities(transport.get_extra_info("peercert"))
        found = inbound(request.headers, self._key, now=self._clock.wall(), identities=identities)
        self.auth.labels(found.result.value).inc()
        for name in found.dropped:
            self.untrusted.labels(name if name in h.TIER_ONLY else "other").inc()
        return found

    def check(self, headers: Mapping[str, str]) -> Inbound:
        """``headers`` as this tier may believe them (not counted)."""
        return inbound(headers, self._key, now=self._clock.wall())

    def locate(self, request: web.Request, sender: Inbound) -> ClientLocation:
        """Where the client is: a proven tier's assertion, else located here."""
        location = asserted_location(sender.headers) if sender.trusted else None
        if location is None:
            location = self._locate_peer(request)
        self.located.labels(location.origin.value).inc()
        return location

    def _locate_peer(self, request: web.Request) -> ClientLocation:
        forwarded = request.headers.get(FORWARDED_FOR)
        return locate_peer(request.remote, forwarded, self._trusted, self._cached)

    def sign(self, headers: CIMultiDict[str]) -> None:
        """Sign outgoing ``headers`` for a peer region (nothing without a key: the peer
        then locates the client itself, from the X-Forwarded-For it is sent)."""
        if self._key is not None:
            self._key.sign(headers, issuer=self._issuer, now=self._clock.wall())


__all__ = ["ClientLocator"]

"""Answers DNS queries: residency, region choice, ECS scopes, precomputed wire answers.

**Fast path.** A query costs: parse (header, question, OPT/ECS), locate the client,
look up a precomputed answer, splice the response together. Three caches, all bounded:

* ``client → (cell, scope)``: the geo cell (country + 0.5° square) of a client subnet
  (ECS) or resolver address, and the prefix length of the network that decided it.
  Depends only on the geo data, so it survives view changes.
* ``(cell, name) → region``: the region choice for a name from a cell (the expensive
  part: residency + the routing profile).
* ``(qname, qtype, cell) → answer``: the rendered answer and authority records, the
  RCODE and counts. The question is echoed from the query and the answer records point
  at it (compression), so one rendering serves every case spelling of the name.

The last two are dropped whenever the view changes (a new fleet snapshot, policy
generation or health verdict) and refill on demand.

**Residency in DNS.** A DNS query carries no tenant. ``api``, ``<jurisdiction>.api``
and ``<region>.api`` answer only regions that the policies allow for a client in the
query's country for *some* tenant (the union of the tenants' allowed sets) — so
tenant-independent rules such as "GDPR clients stay in the EEA" hold for everyone —
or, with ``dns_tenant`` configured, for that tenant. The front door and the regional LB
then enforce each tenant's own set on every request. A name whose allowed set has no
available region gets NODATA (NOERROR, no answer, the SOA) — never an address outside.

**ECS scope** (RFC 7871 §7.2.1) = the prefix length of the network that decided the
location (the GeoIP record's network, narrowed around configured CIDR entries), 0 for
answers that do not depend on the client (SOA, NS, NXDOMAIN, REFUSED). It may be longer
than the source prefix: that tells the resolver its /24 spans more than one location.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import Counter

from global_lb.dns import mmsg, wire
from global_lb.dns.rrl import ResponseRateLimiter, RrlAction, RrlConfig
from global_lb.dns.wire import QType, Query, Rcode, WireError
from global_lb.dns.zone import NameEntry, NameKind, Zone, ZoneConfig
from global_lb.geo import GeoLocator, IPAddress
from global_lb.metrics import GlobalMetrics
from global_lb.router import GlobalRouter, cell_of
from global_lb.view import ANY_MODEL, GlobalView, RegionState, RequestContext
from gtm.clock import Clock
from gtm.models import ClientInfo, GeoPoint, RouteRequest
from policies import ResidencyQuery

log = logging.getLogger(__name__)

#: Bounds of the caches (entries); a full cache is cleared, which only costs recomputing.
MAX_CLIENTS = 262_144
MAX_ANSWERS = 262_144
#: Whole responses remembered by query bytes (about 100 bytes each).
MAX_PACKETS = 131_072
#: RFC 8482 §4.2: answer ANY with one synthesized HINFO record, CPU "RFC8482", OS "".
_HINFO_RFC8482 = b"\x07RFC8482\x00"
_TENANT_FOR_DNS = "dns"

Cell = tuple[str | None, int, int] | None


@dataclass(frozen=True, slots=True)
class _Located:
    cell: Cell
    country: str | None
    point: GeoPoint | None
    scope: int  # prefix length of the deciding network


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A rendered answer: everything after the question, and how to count it."""

    rcode: int
    ancount: int
    nscount: int
    body: bytes
    location_dependent: bool
    counter: Any  # the prometheus counter child of (kind, region, rcode)
    #: Additional records at the end of ``body`` (glue), before the OPT record.
    adcount: int = 0


@dataclass(frozen=True, slots=True)
class _Fast:
    """A whole response, minus its ID, and what answering it counts."""

    tail: bytes
    #: Index of what answering it counts (see :class:`_Tally`).
    slot: int
    #: The answer depends on the resolver's address: look it up per client.
    per_client: bool
    #: Where ``tail``'s bytes are and how many: the batched UDP loop sends them from
    #: there without a copy (mmsg.BatchedUdp.serve).
    address: int = 0
    size: int = 0

    @classmethod
    def of(cls, tail: bytes, slot: int, per_client: bool) -> _Fast:
        return cls(tail, slot, per_client, mmsg.buffer_address(tail), len(tail))


#: The fast-path entry saying "this query's answer depends on who asks".
_PER_CLIENT = _Fast(b"", -1, True)


class _Tally:
    """Fast-path answers counted in plain lists, added to Prometheus by :meth:`flush`.

    Two ``Counter.inc`` calls (response, ECS scope), each taking a lock, would be a large
    share of a cached answer's time. A slot is one (response counter, scope counter)
    pair; each transport has its own list of counts, written by one thread only (UDP: the
    UDP thread; TCP: the event loop), so no increment is lost; :meth:`flush` adds what
    grew since the last flush.
    """

    def __init__(self) -> None:
        self._slot_of: dict[tuple[Counter, Counter | None], int] = {}
        self._counters: list[tuple[Counter, Counter | None]] = []
        #: Counts by transport (index: ``udp``), and what has been flushed of them.
        self.hits: tuple[list[int], list[int]] = ([], [])
        self._flushed: tuple[list[int], list[int]] = ([], [])
        self._lock = threading.Lock()

    def slot(self, counter: Counter, scope: Counter | None) -> int:
        """The slot of a pair (called under the responder's lock)."""
        key = (counter, scope)
        found = self._slot_of.get(key)
        if found is None:
            found = len(self._counters)
            self._counters.append(key)
            for counts in (*self.hits, *self._flushed):
                counts.append(0)
            self._slot_of[key] = found
        return found

    def flush(self) -> None:
        with self._lock:
            pairs = self._counters[:]
            for hits, flushed in zip(self.hits, self._flushed, strict=True):
                for i, (counter, scope) in enumerate(pairs):
                    delta = hits[i] - flushed[i]
                    if delta:
                        flushed[i] += delta
                        counter.inc(delta)
                        if scope is not None:
                            scope.inc(delta)


class Responder:
    """``respond(packet, client, udp=...)`` → response bytes, or ``None`` (drop)."""

    def __init__(
        self,
        config: ZoneConfig,
        *,
        view: Callable[[], GlobalView | None],
        router: GlobalRouter,
        locator: GeoLocator,
        metrics: GlobalMetrics,
        clock: Clock,
        rrl: RrlConfig | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.zone = Zone(config)
        self._config = config
        self._view_source = view
        self._router = router
        self._locator = locator
        self._metrics = metrics
        self._rrl = ResponseRateLimiter(rrl or RrlConfig(), clock)
        self._wall = wall
        self._view: GlobalView | None = None
        self._names: Mapping[bytes, NameEntry] = {}
        self._serial = 0
        self._clients: dict[tuple[int, int, bytes], _Located] = {}
        self._choices: dict[tuple[Cell, NameEntry], RegionState | None] = {}
        self._answers: dict[tuple[bytes, int, Cell], _Prepared] = {}
        self._dns_allowed: dict[str | None, frozenset[str]] = {}
        self._counters: dict[tuple[str, str, str], Counter] = {}
        # What the last slow-path answer counted, for the fast path to repeat.
        self._last: tuple[Counter, Counter | None, bool] | None = None
        self._tally = _Tally()
        #: By transport (index: ``udp``), query bytes after the ID → response.
        self._packets: tuple[dict[bytes, _Fast], dict[bytes, _Fast]] = ({}, {})
        self._per_client: dict[tuple[bytes, bool, IPAddress], _Fast] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ entry point

    def respond(self, packet: bytes, client: IPAddress, *, udp: bool = True) -> bytes | None:
        """The response to one packet from ``client``. Never raises."""
        try:
            return self._respond(packet, client, udp)
        except Exception:  # a bug must cost one answer, never the server
            log.exception("dns: failed to answer a query from %s", client)
            self._metrics.dns_dropped.labels("internal-error").inc()
            return _servfail(packet)

    def respond_udp(self, packet: bytes, client: IPAddress) -> bytes | None:
        """``respond(packet, client, udp=True)``: the UDP loops call this per datagram.

        The fast path of :meth:`_respond` inlined for the common case (no rate limiting,
        the view unchanged, an answer that does not depend on the resolver): two Python
        calls fewer per query, on a path that is only a few calls long. Everything else
        goes through :meth:`respond`. Never raises.
        """
        try:  # free in 3.11 when nothing is raised
            if not self._rrl.enabled and self._view_source() is self._view:
                hit = self._packets[1].get(packet[2:])  # index: udp
                if hit is not None and not hit.per_client:
                    self._tally.hits[1][hit.slot] += 1
                    return packet[:2] + hit.tail
        except Exception:  # respond() below logs it and answers
            pass
        return self.respond(packet, client, udp=True)

    def udp_table(self) -> tuple[Mapping[bytes, _Fast], list[int]] | None:
        """The UDP fast path's table, for a loop that answers a batch itself.

        ``(query bytes after the ID → cached response, hit counts by slot)``: a hit
        that is not ``per_client`` is answered with the query's ID + ``tail`` and
        counted with ``counts[slot] += 1``; everything else goes to :meth:`respond_udp`.
        ``None`` when every datagram must go there (rate limiting is on, or the view
        changed since the table was filled). Valid for one batch (microseconds): a
        view that changes meanwhile is seen by the next batch. Entries are never
        removed from a table handed out (a full one is replaced), so the bytes of a
        hit (``address``) live as long as the caller holds the table.
        """
        if self._rrl.enabled or self._view_source() is not self._view:
            return None
        return self._packets[1], self._tally.hits[1]

    def _respond(self, packet: bytes, client: IPAddress, udp: bool) -> bytes | None:
        if udp and self._rrl.enabled:
            action = self._rrl.check(client)
            if action is RrlAction.DROP:
                self._metrics.dns_dropped.labels("rate-limited").inc()
                return None
            if action is RrlAction.SLIP:
                return self._slip(packet)
        # Fast path: while the view is the same, the same query (all but its ID) gets the
        # same response (all but its ID) — from the same resolver, when its address (not
        # an ECS option) located the client.
        body = packet[2:]
        if self._view_source() is self._view:
            hit = self._packets[udp].get(body)
            if hit is not None and hit.per_client:
                hit = self._per_client.get((body, udp, client))
            if hit is not None:
                self._tally.hits[udp][hit.slot] += 1
                return packet[:2] + hit.tail
        # One slow path at a time: UDP is answered in a thread of its own, TCP on the
        # event loop; the caches and ``_last`` are shared. The fast path above only
        # reads, and one dict operation is atomic under the GIL; ``_reset`` replaces
        # the dicts whole.
        with self._lock:
            self._last = None
            reply = self._respond_slow(packet, client, udp)
            last = self._last
            if reply is not None and last is not None:
                counter, scope, per_client = last
                fast = _Fast.of(reply[2:], self._tally.slot(counter, scope), per_client)
                self._remember(body, udp, client, fast)
        return reply

    def flush_counts(self) -> None:
        """Add the fast path's answers to the Prometheus counters (the global tier does
        every second, and before a DNS worker reports its counters)."""
        self._tally.flush()

    def _remember(self, body: bytes, udp: bool, client: IPAddress, fast: _Fast) -> None:
        packets = self._packets[udp]
        if len(packets) >= MAX_PACKETS or len(self._per_client) >= MAX_PACKETS:
            # A new table, not clear(): a batch may still hold the old one, and the
            # batched loop sends its entries' bytes from where they are (udp_table).
            packets = {}
            self._packets = (packets, self._packets[1]) if not udp else (self._packets[0], packets)
            self._per_client = {}
        if fast.per_client:
            packets[body] = _PER_CLIENT
            self._per_client[(body, udp, client)] = fast
        else:
            packets[body] = fast

    def _slip(self, packet: bytes) -> bytes | None:
        """RRL's slip: the query's header and question, TC set, nothing else."""
        try:
            query = wire.parse_query(packet)
        except WireError as exc:
            return wire.error_response(exc)
        self._metrics.dns_truncated.labels("rrl-slip").inc()
        return wire.response(query, Rcode.NOERROR, 0, 0, b"", max_size=0)

    def _respond_slow(self, packet: bytes, client: IPAddress, udp: bool) -> bytes | None:
        try:
            query = wire.parse_query(packet)
        except WireError as exc:
            reply = wire.error_response(exc)
            if reply is None:
                self._metrics.dns_dropped.labels("unanswerable").inc()
            else:
                self._count("other", "", exc.rcode.name).inc()
            return reply
        max_size = 65_535
        if udp:
            max_size = min(query.payload, wire.MAX_UDP_PAYLOAD) if query.edns else 512
        return self._answer(query, client, max_size)

    # ------------------------------------------------------------------ answering

    def _answer(self, query: Query, client: IPAddress, max_size: int) -> bytes:
        view = self._view_source()
        if view is not self._view:
            self._reset(view)
        if view is None:
            return self._simple(query, Rcode.SERVFAIL, max_size)
        if query.edns_version != 0:
            return self._simple(query, Rcode.BADVERS, max_size)
        if query.qclass != wire.CLASS_IN or query.qtype in (QType.AXFR, QType.IXFR):
            return self._simple(query, Rcode.REFUSED, max_size)
        entry = self._names.get(query.qname)
        located = None
        if entry is not None and entry.location_dependent:
            located = self._locate(query, client)
            cell = located.cell
        else:
            cell = None
        key = (query.qname, query.qtype, cell)
        prepared = self._answers.get(key)
        if prepared is None:
            prepared = self._prepare(query, entry, located, view)
            if len(self._answers) >= MAX_ANSWERS:
                self._answers.clear()
            self._answers[key] = prepared
        prepared.counter.inc()
        scope = None
        scope_counter = None
        if query.ecs is not None:
            scope = located.scope if (located is not None and prepared.location_dependent) else 0
            scope_counter = self._scope_counter(query.ecs.family, scope)
            scope_counter.inc()
        by_resolver = located is not None and (query.ecs is None or query.ecs.source == 0)
        self._last = (prepared.counter, scope_counter, by_resolver and prepared.location_dependent)
        reply = wire.response(
            query,
            prepared.rcode,
            prepared.ancount,
            prepared.nscount,
            prepared.body,
            max_size=max_size,
            ecs_scope=scope,
            adcount=prepared.adcount,
        )
        if len(reply) < 12 + len(query.question) + len(prepared.body):
            self._metrics.dns_truncated.labels("too-large").inc()
        return reply

    def _simple(self, query: Query, rcode: Rcode, max_size: int) -> bytes:
        self._count("other", "", rcode.name).inc()
        scope = 0 if query.ecs is not None else None
        return wire.response(query, rcode, 0, 0, b"", max_size=max_size, ecs_scope=scope)

    def _scope_counter(self, family: int, scope: int) -> Counter:
        key = ("ipv4" if family == 1 else "ipv6", str(scope), "")
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self._metrics.ecs_scope.labels(key[0], key[1])
        return counter

    def forget_locations(self) -> None:
        """Drop what was found with the previous GeoIP database: client locations and the
        whole responses answered from them. Under the slow path's lock, so no answer
        located with the old database is remembered after this; the fast path (another
        thread) misses into the slow path from the next query on."""
        with self._lock:
            self._clients = {}
            self._per_client = {}
            self._packets = ({}, {})

    def _reset(self, view: GlobalView | None) -> None:
        # The view last: until it is set, the fast path (another thread) misses.
        self._packets = ({}, {})
        self._per_client = {}
        self._choices = {}
        self._answers = {}
        self._dns_allowed = {}
        self._names = {} if view is None else self.zone.names(view)
        self._view = view
        # RFC 1982 serial: seconds since the epoch mod 2^32 grows with every view.
        self._serial = max(self._serial + 1, int(self._wall())) % (1 << 32)
        self._metrics.dns_rebuilds.inc()

    def _count(self, kind: str, region: str, rcode: str) -> Counter:
        key = (kind, region, rcode)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self._metrics.dns_responses.labels(*key)
        return counter

    # ------------------------------------------------------------------ location

    def _locate(self, query: Query, client: IPAddress) -> _Located:
        ecs = query.ecs
        if ecs is not None and ecs.source > 0:
            key = (ecs.family, ecs.source, ecs.address)
        else:
            key = (client.version, -1, client.packed)
        found = self._clients.get(key)
        if found is not None:
            return found
        if ecs is not None and ecs.source > 0:
            address: IPAddress = ipaddress.ip_address(ecs.padded())
        else:
            address = client
        location = self._locator.locate(address)
        scope = location.network.prefixlen
        if ecs is not None and ecs.source == 0:
            scope = 0  # RFC 7871 §7.1.2: the resolver opted out; answer is not tailored
        found = _Located(
            cell_of(location.point, location.country), location.country, location.point, scope
        )
        if len(self._clients) >= MAX_CLIENTS:
            self._clients.clear()
        self._clients[key] = found
        return found

    # ------------------------------------------------------------------ rendering

    def _prepare(
        self, query: Query, entry: NameEntry | None, located: _Located | None, view: GlobalView
    ) -> _Prepared:
        zone = self.zone
        if entry is None:
            if not zone.contains(query.qname):
                return self._prepared(Rcode.REFUSED, 0, b"", "other", "", False)
            soa = zone.soa_record(zone.apex_pointer(query.qname), self._serial)
            return self._prepared(Rcode.NXDOMAIN, 0, soa, "other", "", False, nscount=1)
        if query.qtype == QType.ANY:
            hinfo = wire.rr(wire.QNAME_POINTER, QType.HINFO, self._config.ttl, _HINFO_RFC8482)
            return self._prepared(Rcode.NOERROR, 1, hinfo, entry.kind.value, "", False)
        if entry.kind is NameKind.APEX:
            return self._apex(query)
        if entry.kind is NameKind.NS:
            return self._addresses(
                query, entry, zone.ns_addresses(entry.target, _version(query.qtype)), "", False
            )
        assert located is not None
        region = self._choose(entry, located, view)
        if region is None:
            self._metrics.refusals.labels("dns", f"no-region:{entry.kind.value}").inc()
            return self._nodata(query, entry.kind.value, "", True)
        packed = _region_addresses(region, _version(query.qtype), self._config.max_addresses)
        return self._addresses(query, entry, packed, region.id, True)

    def _apex(self, query: Query) -> _Prepared:
        zone = self.zone
        if query.qtype == QType.SOA:
            soa = zone.soa_record(wire.QNAME_POINTER, self._serial, negative=False)
            return self._prepared(Rcode.NOERROR, 1, soa, "apex", "", False)
        if query.qtype == QType.NS:
            records, count = zone.ns_records()
            glue, glued = zone.glue()
            return self._prepared(
                Rcode.NOERROR, count, records + glue, "apex", "", False, adcount=glued
            )
        return self._nodata(query, "apex", "", False)

    def _addresses(
        self,
        query: Query,
        entry: NameEntry,
        packed: tuple[bytes, ...],
        region: str,
        dependent: bool,
    ) -> _Prepared:
        if query.qtype not in (QType.A, QType.AAAA) or not packed:
            return self._nodata(query, entry.kind.value, region, dependent)
        ttl = self._config.ttl
        body = b"".join(wire.rr(wire.QNAME_POINTER, query.qtype, ttl, a) for a in packed)
        return self._prepared(Rcode.NOERROR, len(packed), body, entry.kind.value, region, dependent)

    def _nodata(self, query: Query, kind: str, region: str, dependent: bool) -> _Prepared:
        soa = self.zone.soa_record(self.zone.apex_pointer(query.qname), self._serial)
        return self._prepared(Rcode.NOERROR, 0, soa, kind, region, dependent, nscount=1)

    def _prepared(
        self,
        rcode: Rcode,
        ancount: int,
        body: bytes,
        kind: str,
        region: str,
        dependent: bool,
        *,
        nscount: int = 0,
        adcount: int = 0,
    ) -> _Prepared:
        counter = self._count(kind, region, rcode.name)
        return _Prepared(rcode, ancount, nscount, body, dependent, counter, adcount)

    # ------------------------------------------------------------------ region choice

    def _choose(self, entry: NameEntry, located: _Located, view: GlobalView) -> RegionState | None:
        key = (located.cell, entry)
        if key in self._choices:
            return self._choices[key]
        allowed = self.allowed_for(located.country, view)
        if entry.kind is NameKind.JURISDICTION:
            allowed = allowed & view.jurisdictions.get(entry.target, frozenset())
        elif entry.kind is NameKind.REGION:
            allowed = allowed & {entry.target}
        request = RouteRequest(
            request_id=f"dns/{entry.kind.value}/{entry.target}/{located.cell}",
            model=ANY_MODEL,
            input_tokens=0,
            tenant=self._config.dns_tenant or _TENANT_FOR_DNS,
            client=ClientInfo(country=located.country, location=located.point),
        )
        ctx = RequestContext(view, allowed, located.point, located.country, "dns")
        region = self._router.choose_region(request, view, ctx) if allowed else None
        self._choices[key] = region
        self._metrics.decisions.labels("dns", region.id if region else "refused").inc()
        return region

    def allowed_for(self, country: str | None, view: GlobalView) -> frozenset[str]:
        """Regions a client in ``country`` may be sent to by DNS (see module docstring)."""
        found = self._dns_allowed.get(country)
        if found is not None:
            return found
        engine = view.policy.engine
        tenant = self._config.dns_tenant
        tenants = [tenant] if tenant else sorted(view.policy.policy_set.tenants)
        if not tenants:
            tenants = [_TENANT_FOR_DNS]
        allowed: set[str] = set()
        for name in tenants:
            verdict = engine.allowed_regions(ResidencyQuery(name, ANY_MODEL, "default", country))
            allowed |= verdict.allowed
        found = self._dns_allowed[country] = frozenset(allowed)
        return found


def _version(qtype: int) -> int:
    return 6 if qtype == QType.AAAA else 4


def _region_addresses(region: RegionState, version: int, limit: int) -> tuple[bytes, ...]:
    """The packed addresses of a region's endpoints in one IP family (at most ``limit``):
    each endpoint's ``address``, or its URL's host when that is an IP literal."""
    found: list[bytes] = []
    for endpoint in region.endpoints:
        address = endpoint.address
        if address is None:
            address = _url_host_address(endpoint.url)
        if address is not None and address.version == version and address.packed not in found:
            found.append(address.packed)
    return tuple(found[:limit])


def _url_host_address(url: str) -> IPAddress | None:
    host = urlsplit(url).hostname
    if host is None:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _servfail(packet: bytes) -> bytes | None:
    """SERVFAIL echoing the header of a packet we failed on (if it has one)."""
    if len(packet) < 12 or packet[2] & 0x80:
        return None
    header = (int.from_bytes(packet[:2]), int.from_bytes(packet[2:4]))
    return wire.error_response(WireError(Rcode.SERVFAIL, "internal error", header=header))

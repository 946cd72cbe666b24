"""The zone: its configuration, its names, and its SOA and NS records.

Names (ARCHITECTURE §9), all under the zone (default ``inference.example.``):

============================  ===============================================
``<zone>``                    SOA and NS
``<ns>.<zone>``               the in-zone name servers' A/AAAA (their glue)
``api.<zone>``                the best region for the client: geo, latency, capacity
``<jurisdiction>.api.<zone>`` the best region inside the jurisdiction (``eu.api``)
``<region>.api.<zone>``       one region (while it is available and allowed)
============================  ===============================================

Anything else under the zone is NXDOMAIN; anything outside it is REFUSED (we are not a
resolver). Names are matched on their lower-cased wire form.

**Delegation** (docs/dns-delegation.md). The parent zone delegates with NS records
naming these servers, and — for a name server inside this zone — glue A/AAAA records,
without which a resolver could not find the server (the name is only answered by the
server itself). So the NS set, and the SOA that closes every negative answer, are
configuration (``gtm global --ns/--soa-*``), checked here once: an in-zone name server
is one label directly under the zone (its address is answered from this
configuration, and an empty non-terminal above it would be NXDOMAIN), never ``api``;
a name server outside the zone has no addresses here (they live in its own zone).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import dns.name

from global_lb.dns import wire
from global_lb.dns.zone_config import (
    DEFAULT_EXPIRE,
    DEFAULT_MAX_ADDRESSES,
    DEFAULT_REFRESH,
    DEFAULT_RETRY,
    DEFAULT_TTL,
    DEFAULT_ZONE,
    NameServer,
    SerialPolicy,
    ZoneConfig,
    absolute_name,
    mailbox_name,
)
from global_lb.view import GlobalView


class NameKind(StrEnum):
    APEX = "apex"
    NS = "ns"
    API = "api"
    JURISDICTION = "jurisdiction"
    REGION = "region"


@dataclass(frozen=True, slots=True)
class NameEntry:
    kind: NameKind
    #: The region, jurisdiction or name-server label the name is about ("" for api/apex).
    target: str = ""

    @property
    def location_dependent(self) -> bool:
        return self.kind in (NameKind.API, NameKind.JURISDICTION, NameKind.REGION)


def name_wire(name: dns.name.Name) -> bytes:
    """An absolute name's uncompressed wire form."""
    data = name.to_wire()
    assert data is not None  # absolute names always render
    return data


def to_wire(labels: tuple[str, ...]) -> bytes:
    return b"".join(bytes([len(label)]) + label.encode() for label in labels) + b"\x00"


class Zone:
    """The zone's fixed records and, per view, its name table."""

    def __init__(self, config: ZoneConfig) -> None:
        self.config = config
        name = dns.name.from_text(config.zone)
        self._labels = tuple(label.decode().lower() for label in name.labels[:-1])
        self.wire = to_wire(self._labels)
        self.text = config.zone
        servers = [(absolute_name(ns.name, name), ns) for ns in config.name_servers]
        #: Every NS name (wire form), in the configured order.
        self._ns_names = tuple(name_wire(n) for n, _ in servers)
        #: The in-zone name servers by label, with their addresses (glue).
        self._ns = {
            n.relativize(name).labels[0].decode(): ns for n, ns in servers if n.is_subdomain(name)
        }
        self._glue = tuple((self.wire_name(label), ns.addresses) for label, ns in self._ns.items())
        mname = absolute_name(config.primary, name) if config.primary else servers[0][0]
        self._mname = name_wire(mname)
        self._rname = name_wire(mailbox_name(config.hostmaster, name))
        #: RFC 2308 §3/§5: a negative answer is cached for min(the SOA's TTL, MINIMUM);
        #: the SOA it carries has MINIMUM as its TTL, so it is cached for MINIMUM exactly.
        self._soa_ttl = config.negative_ttl

    def wire_name(self, *prefix: str) -> bytes:
        return to_wire((*prefix, *self._labels))

    def names(self, view: GlobalView) -> Mapping[bytes, NameEntry]:
        """Every name that exists in the zone for ``view``, keyed by lower-case wire form."""
        table: dict[bytes, NameEntry] = {
            self.wire: NameEntry(NameKind.APEX),
            self.wire_name("api"): NameEntry(NameKind.API),
        }
        for label in self._ns:
            table[self.wire_name(label)] = NameEntry(NameKind.NS, label)
        for jurisdiction in view.jurisdictions:
            table[self.wire_name(jurisdiction, "api")] = NameEntry(
                NameKind.JURISDICTION, jurisdiction
            )
        for region in view.regions:  # a region id wins over a jurisdiction of that name
            table[self.wire_name(region.id, "api")] = NameEntry(NameKind.REGION, region.id)
        return table

    def contains(self, qname: bytes) -> bool:
        """Whether the (lower-case, uncompressed) wire name is the zone or below it."""
        if not qname.endswith(self.wire):
            return False
        cut = len(qname) - len(self.wire)
        offset = 0
        while offset < cut:  # the suffix must start on a label boundary
            offset += 1 + qname[offset]
        return offset == cut

    def apex_pointer(self, qname: bytes) -> bytes:
        """A compression pointer to the zone apex inside the echoed question name."""
        return wire.pointer(12 + len(qname) - len(self.wire))

    def soa_rdata(self, serial: int) -> bytes:
        config = self.config
        if config.serial_policy is SerialPolicy.FIXED:
            serial = config.serial
        timers = struct.pack(
            ">IIIII", serial, config.refresh, config.retry, config.expire, config.negative_ttl
        )
        return self._mname + self._rname + timers

    def soa_record(self, owner: bytes, serial: int, *, negative: bool = True) -> bytes:
        """The SOA record; in a negative answer's authority section (``negative``) its TTL
        is the negative-caching time, else the zone's TTL."""
        ttl = self._soa_ttl if negative else self.config.ttl
        return wire.rr(owner, wire.QType.SOA, ttl, self.soa_rdata(serial))

    def ns_records(self) -> tuple[bytes, int]:
        """The apex NS RRset (owner: the question name) and its record count."""
        records = [
            wire.rr(wire.QNAME_POINTER, wire.QType.NS, self.config.ttl, name)
            for name in self._ns_names
        ]
        return b"".join(records), len(records)

    def glue(self) -> tuple[bytes, int]:
        """The in-zone name servers' A and AAAA records (for the additional section of
        an NS answer, RFC 9471: glue for in-domain servers is not optional) and their
        count."""
        ttl = self.config.ttl
        records = [
            wire.rr(owner, wire.QType.A if a.version == 4 else wire.QType.AAAA, ttl, a.packed)
            for owner, addresses in self._glue
            for a in sorted(addresses, key=lambda a: a.version)
        ]
        return b"".join(records), len(records)

    def ns_addresses(self, label: str, version: int) -> tuple[bytes, ...]:
        ns = self._ns.get(label)
        if ns is None:
            return ()
        return tuple(a.packed for a in ns.addresses if a.version == version)


__all__ = [
    "DEFAULT_EXPIRE",
    "DEFAULT_MAX_ADDRESSES",
    "DEFAULT_REFRESH",
    "DEFAULT_RETRY",
    "DEFAULT_TTL",
    "DEFAULT_ZONE",
    "NameEntry",
    "NameKind",
    "NameServer",
    "SerialPolicy",
    "Zone",
    "ZoneConfig",
    "absolute_name",
    "mailbox_name",
    "name_wire",
    "to_wire",
]

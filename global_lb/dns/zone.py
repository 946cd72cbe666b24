"""The zone: its configuration, its names, and its SOA and NS records.

Names (ARCHITECTURE §9), all under the zone (default ``inference.example.``):

============================  ===============================================
``<zone>``                    SOA and NS
``<ns>.<zone>``               the name servers' A/AAAA (when configured)
``api.<zone>``                the best region for the client: geo, latency, capacity
``<jurisdiction>.api.<zone>`` the best region inside the jurisdiction (``eu.api``)
``<region>.api.<zone>``       one region (while it is available and allowed)
============================  ===============================================

Anything else under the zone is NXDOMAIN; anything outside it is REFUSED (we are not a
resolver). Names are matched on their lower-cased wire form.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import dns.name
from pydantic import Field, field_validator

from global_lb.dns import wire
from global_lb.view import GlobalView
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


class NameServer(Frozen):
    """One of the zone's name servers: a label under the zone and its addresses."""

    label: str = Field(default="ns1", pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    addresses: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...] = ()


class ZoneConfig(Frozen):
    zone: str = DEFAULT_ZONE
    ttl: int = Field(default=DEFAULT_TTL, ge=0, le=86_400)
    #: SOA MINIMUM: how long resolvers cache NXDOMAIN/NODATA (RFC 2308 §4). As short as
    #: the TTL, so a region coming back is seen as fast as one going away.
    negative_ttl: int = Field(default=DEFAULT_TTL, ge=0, le=86_400)
    name_servers: tuple[NameServer, ...] = (NameServer(),)
    hostmaster: str = Field(default="hostmaster", pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
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
        self._ns = {ns.label: ns for ns in config.name_servers}

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
        mname = self.wire_name(self.config.name_servers[0].label)
        rname = self.wire_name(self.config.hostmaster)
        # REFRESH/RETRY/EXPIRE are for secondaries pulling the zone; we serve no
        # transfers, so they are RFC 1912 §2.2's suggested values, for completeness.
        timers = struct.pack(">IIIII", serial, 3600, 600, 604_800, self.config.negative_ttl)
        return mname + rname + timers

    def soa_record(self, owner: bytes, serial: int) -> bytes:
        return wire.rr(owner, wire.QType.SOA, self.config.negative_ttl, self.soa_rdata(serial))

    def ns_records(self) -> tuple[bytes, int]:
        """The apex NS RRset (owner: the question name) and its record count."""
        records = [
            wire.rr(wire.QNAME_POINTER, wire.QType.NS, self.config.ttl, self.wire_name(ns.label))
            for ns in self.config.name_servers
        ]
        return b"".join(records), len(records)

    def ns_addresses(self, label: str, version: int) -> tuple[bytes, ...]:
        ns = self._ns.get(label)
        if ns is None:
            return ()
        return tuple(a.packed for a in ns.addresses if a.version == version)

"""DNS wire format for the answer fast path: parse a query, assemble a response.

Sans-io, pure functions over ``bytes``. dnspython (``dns.message``) would parse and
render any message, but building its object model for every query would cap a Python
server far below the peers it is measured against (``bench/geodns_throughput.py``);
queries are small and rigid, so this module reads exactly what an authoritative server
needs — header, the one question, the OPT
record and its Client Subnet option — and rejects the rest with the right RCODE.
dnspython stays the reference: the tests check every answer by parsing it with it.

References: RFC 1035 §4.1 (message format), RFC 6891 (EDNS(0), OPT), RFC 7871 (Client
Subnet), RFC 9619 (QDCOUNT must be 1), RFC 8482 (ANY).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from global_lb.errors import WireError as WireError  # raised here; re-exported

_HEADER = struct.Struct(">HHHHHH")
_U16 = struct.Struct(">H")
_RR_FIXED = struct.Struct(">HHIH")  # type, class, ttl, rdlength
_OPT_FIXED = struct.Struct(
    ">BHHBBHH"
)  # root owner, type, payload, ext rcode, version, flags, rdlen


class Rcode(IntEnum):
    NOERROR = 0
    FORMERR = 1
    SERVFAIL = 2
    NXDOMAIN = 3
    NOTIMP = 4
    REFUSED = 5
    BADVERS = 16  # extended (RFC 6891 §6.1.3): 4 bits in the header, 8 in OPT


class QType(IntEnum):
    A = 1
    NS = 2
    SOA = 6
    HINFO = 13
    AAAA = 28
    OPT = 41
    IXFR = 251
    AXFR = 252
    ANY = 255


CLASS_IN = 1
OPTION_ECS = 8
#: RFC 1035 §4.2.1: without EDNS a UDP message is at most 512 bytes.
CLASSIC_UDP_SIZE = 512
#: What we accept and advertise over UDP: 1232 bytes, the DNS Flag Day 2020 value
#: (fits a 1280-byte IPv6 minimum MTU with IP and UDP headers, so no fragmentation).
MAX_UDP_PAYLOAD = 1232
#: Flags: QR, AA, TC, RD (RFC 1035 §4.1.1).
QR, AA, TC, RD = 0x8000, 0x0400, 0x0200, 0x0100
_OPCODE_MASK = 0x7800
_DO = 0x8000  # EDNS header flag "DNSSEC OK"


@dataclass(frozen=True, slots=True)
class ClientSubnet:
    """An ECS option (RFC 7871 §6): FAMILY 1 = IPv4, 2 = IPv6."""

    family: int
    source: int
    scope: int
    address: bytes  # exactly ceil(source / 8) bytes, as on the wire

    def padded(self) -> bytes:
        """The address padded to its family's full length (for ip_address())."""
        width = 4 if self.family == 1 else 16
        return self.address + bytes(width - len(self.address))


@dataclass(frozen=True, slots=True)
class Query:
    """A parsed query: everything the answer path needs."""

    id: int
    flags: int
    #: The question section as received (name, type, class): echoed back verbatim, so
    #: the resolver's 0x20 case randomisation survives.
    question: bytes
    #: The question name in wire form, lower-cased: the key of every answer lookup.
    qname: bytes
    qtype: int
    qclass: int
    edns: bool = False
    payload: int = CLASSIC_UDP_SIZE
    edns_version: int = 0
    ecs: ClientSubnet | None = None


def read_name(data: bytes, offset: int) -> int:
    """The offset just past an uncompressed name at ``offset``.

    Question names are never compressed in practice (there is nothing before them to
    point at), so a pointer is refused; so are label types 01/10 (RFC 6891 §5 retired
    them) and names over 255 bytes (RFC 1035 §3.1).
    """
    start = offset
    end = len(data)
    while True:
        if offset >= end:
            raise ValueError("name runs past the end of the message")
        length = data[offset]
        if length == 0:
            offset += 1
            break
        if length & 0xC0:
            raise ValueError("compressed or extended label in a question name")
        offset += 1 + length
        if offset - start > 255:
            raise ValueError("name longer than 255 bytes")
    if offset - start > 255:
        raise ValueError("name longer than 255 bytes")
    return offset


def skip_record_name(data: bytes, offset: int) -> int:
    """The offset past a possibly compressed name in a resource record."""
    end = len(data)
    while True:
        if offset >= end:
            raise ValueError("name runs past the end of the message")
        length = data[offset]
        if length == 0:
            return offset + 1
        if length & 0xC0 == 0xC0:
            if offset + 2 > end:
                raise ValueError("truncated compression pointer")
            return offset + 2
        if length & 0xC0:
            raise ValueError("unknown label type")
        offset += 1 + length


def parse_query(data: bytes) -> Query:
    """Parse a query. Raises :class:`WireError` saying how to answer a bad one."""
    if len(data) < 12:
        raise WireError(Rcode.FORMERR, "shorter than a header")  # nothing to answer to
    ident, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(data)
    header = (ident, flags)
    if flags & QR:
        raise WireError(Rcode.FORMERR, "a response, not a query")  # never answer those
    if flags & _OPCODE_MASK:
        raise WireError(Rcode.NOTIMP, "opcode other than QUERY", header=header)
    if qdcount != 1:
        raise WireError(Rcode.FORMERR, f"QDCOUNT {qdcount} (RFC 9619: must be 1)", header=header)
    try:
        name_end = read_name(data, 12)
    except ValueError as exc:
        raise WireError(Rcode.FORMERR, str(exc), header=header) from None
    if name_end + 4 > len(data):
        raise WireError(Rcode.FORMERR, "question runs past the end", header=header)
    qtype, qclass = struct.unpack_from(">HH", data, name_end)
    question = data[12 : name_end + 4]
    if ancount or nscount:
        raise WireError(
            Rcode.FORMERR, "records in answer/authority", header=header, question=question
        )
    query = Query(ident, flags, question, data[12:name_end].lower(), qtype, qclass)
    return _additional(data, name_end + 4, arcount, query)


def _additional(data: bytes, offset: int, arcount: int, query: Query) -> Query:
    edns: tuple[int, int, ClientSubnet | None] | None = None
    header = (query.id, query.flags)
    for _ in range(arcount):
        try:
            name_start = offset
            offset = skip_record_name(data, offset)
            rtype, rclass, ttl, rdlen = _RR_FIXED.unpack_from(data, offset)
        except (ValueError, struct.error):
            raise WireError(
                Rcode.FORMERR, "malformed additional record", header=header, question=query.question
            ) from None
        rdata_start = offset + _RR_FIXED.size
        offset = rdata_start + rdlen
        if offset > len(data):
            raise WireError(
                Rcode.FORMERR, "record runs past the end", header=header, question=query.question
            )
        if rtype != QType.OPT:
            continue  # e.g. a TSIG we do not verify: answered as if unsigned
        if edns is not None or data[name_start] != 0:
            raise WireError(
                Rcode.FORMERR,
                "second OPT record or OPT not owned by the root (RFC 6891 §6.1.1)",
                header=header,
                question=query.question,
            )
        version = (ttl >> 16) & 0xFF
        ecs = _options(data, rdata_start, offset, query)
        edns = (rclass, version, ecs)
    if offset != len(data):
        raise WireError(
            Rcode.FORMERR,
            "trailing bytes after the message",
            header=header,
            question=query.question,
            edns=edns is not None,
        )
    if edns is None:
        return query
    payload, version, ecs = edns
    return Query(
        query.id,
        query.flags,
        query.question,
        query.qname,
        query.qtype,
        query.qclass,
        edns=True,
        # RFC 6891 §6.2.5: values below 512 are treated as 512.
        payload=max(CLASSIC_UDP_SIZE, payload),
        edns_version=version,
        ecs=ecs,
    )


def _options(data: bytes, offset: int, end: int, query: Query) -> ClientSubnet | None:
    ecs: ClientSubnet | None = None
    while offset < end:
        if offset + 4 > end:
            raise _ecs_error(query, "truncated EDNS option")
        code, length = struct.unpack_from(">HH", data, offset)
        offset += 4
        if offset + length > end:
            raise _ecs_error(query, "EDNS option runs past the OPT record")
        if code == OPTION_ECS:
            if ecs is not None:
                raise _ecs_error(query, "two Client Subnet options")
            ecs = parse_ecs(data[offset : offset + length], query)
        offset += length
    return ecs


def _ecs_error(query: Query, why: str) -> WireError:
    return WireError(
        Rcode.FORMERR, why, header=(query.id, query.flags), question=query.question, edns=True
    )


def parse_ecs(option: bytes, query: Query) -> ClientSubnet:
    """Validate a Client Subnet option; malformed ones are FORMERR (RFC 7871 §6, §7.1.2)."""
    if len(option) < 4:
        raise _ecs_error(query, "Client Subnet option shorter than 4 bytes")
    family, source, scope = struct.unpack_from(">HBB", option)
    address = option[4:]
    if family not in (1, 2):
        raise _ecs_error(query, f"Client Subnet FAMILY {family} is not 1 (IPv4) or 2 (IPv6)")
    width = 32 if family == 1 else 128
    if source > width:
        raise _ecs_error(query, f"SOURCE PREFIX-LENGTH {source} > {width}")
    if scope != 0:
        # §6: "SCOPE PREFIX-LENGTH ... In queries, it MUST be set to 0."
        raise _ecs_error(query, "SCOPE PREFIX-LENGTH must be 0 in a query")
    if len(address) != (source + 7) // 8:
        raise _ecs_error(query, "ADDRESS length does not match SOURCE PREFIX-LENGTH")
    if source % 8 and address[-1] & (0xFF >> (source % 8)):
        raise _ecs_error(query, "ADDRESS has bits set beyond SOURCE PREFIX-LENGTH")
    return ClientSubnet(family, source, 0, bytes(address))


# ---------------------------------------------------------------------------- building


def opt_record(
    payload: int, ext_rcode: int = 0, ecs: ClientSubnet | None = None, scope: int = 0
) -> bytes:
    """Our OPT record: version 0, no flags, and the ECS option echoed with ``scope``."""
    options = b""
    if ecs is not None:
        body = struct.pack(">HBB", ecs.family, ecs.source, scope) + ecs.address
        options = struct.pack(">HH", OPTION_ECS, len(body)) + body
    return _OPT_FIXED.pack(0, QType.OPT, payload, ext_rcode, 0, 0, len(options)) + options


def response(
    query: Query,
    rcode: int,
    ancount: int,
    nscount: int,
    body: bytes,
    *,
    max_size: int,
    ecs_scope: int | None = None,
    authoritative: bool = True,
    adcount: int = 0,
) -> bytes:
    """A whole response: header, the echoed question, ``body`` (answer, authority and
    ``adcount`` additional records, already rendered), and an OPT record when the query
    had one (the last additional record).

    When the result exceeds ``max_size`` (a UDP limit), the answer is dropped and TC is
    set, so the client retries over TCP (RFC 1035 §4.2.1, RFC 7766).
    """
    opt = b""
    if query.edns:
        ecs = query.ecs if ecs_scope is not None else None
        opt = opt_record(MAX_UDP_PAYLOAD, rcode >> 4, ecs, ecs_scope or 0)
    flags = QR | (query.flags & RD) | (rcode & 0xF)
    if authoritative:
        flags |= AA
    arcount = 1 if opt else 0
    message = (
        _HEADER.pack(query.id, flags, 1, ancount, nscount, adcount + arcount)
        + query.question
        + body
        + opt
    )
    if len(message) <= max_size:
        return message
    return _HEADER.pack(query.id, flags | TC, 1, 0, 0, arcount) + query.question + opt


def error_response(error: WireError) -> bytes | None:
    """The response to a query that failed to parse, or ``None`` when there is none to
    give (no readable header, or the packet was itself a response)."""
    if error.header is None:
        return None
    ident, flags = error.header
    qdcount = 1 if error.question else 0
    opt = opt_record(MAX_UDP_PAYLOAD) if error.edns else b""
    out_flags = QR | (flags & RD) | (flags & _OPCODE_MASK) | (error.rcode & 0xF)
    header = _HEADER.pack(ident, out_flags, qdcount, 0, 0, 1 if opt else 0)
    return header + error.question + opt


def rr(owner: bytes, rtype: int, ttl: int, rdata: bytes, rclass: int = CLASS_IN) -> bytes:
    """One resource record (``owner`` already in wire form or a pointer)."""
    return owner + _RR_FIXED.pack(rtype, rclass, ttl, len(rdata)) + rdata


def pointer(offset: int) -> bytes:
    """A compression pointer to ``offset`` (RFC 1035 §4.1.4)."""
    return _U16.pack(0xC000 | offset)


#: A pointer to the question name, which always starts right after the header.
QNAME_POINTER = pointer(12)

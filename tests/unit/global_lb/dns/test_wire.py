from __future__ import annotations

import struct

import dns.edns
import dns.flags
import dns.message
import dns.rcode
import pytest

from global_lb.dns import wire
from global_lb.dns.wire import Rcode, WireError


def query(name: str = "api.inference.example.", rdtype: str = "A", **kw: object) -> bytes:
    return dns.message.make_query(name, rdtype, **kw).to_wire()  # type: ignore[arg-type]


def test_plain_query() -> None:
    q = wire.parse_query(query("API.Inference.Example."))
    assert q.qname == b"\x03api\x09inference\x07example\x00"
    assert q.question.startswith(b"\x03API")  # echoed as sent (0x20 randomisation)
    assert (q.qtype, q.qclass, q.edns, q.ecs) == (1, 1, False, None)


def test_edns_and_ecs() -> None:
    data = query(use_edns=0, payload=4096, options=[dns.edns.ECSOption("81.2.69.0", 24)])
    q = wire.parse_query(data)
    assert q.edns
    assert q.payload == 4096
    assert q.ecs == wire.ClientSubnet(1, 24, 0, bytes([81, 2, 69]))
    six = wire.parse_query(query(use_edns=0, options=[dns.edns.ECSOption("2001:db8:1::", 48)]))
    assert six.ecs is not None
    assert six.ecs.padded()[:6] == bytes.fromhex("20010db80001")


def ecs_query(option: bytes) -> bytes:
    """A query whose OPT carries a raw ECS option body (to write malformed ones)."""
    base = query()
    header = bytearray(base[:12])
    header[11] = 1  # ARCOUNT
    opt = (
        struct.pack(">BHHBBHH", 0, 41, 1232, 0, 0, 0, 4 + len(option))
        + struct.pack(">HH", 8, len(option))
        + option
    )
    return bytes(header) + base[12:] + opt


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (struct.pack(">HBB", 3, 24, 0) + b"\x01\x02\x03", "FAMILY"),
        (struct.pack(">HBB", 1, 33, 0) + b"\x01\x02\x03\x04\x05", "SOURCE PREFIX-LENGTH"),
        (struct.pack(">HBB", 1, 24, 8) + b"\x01\x02\x03", "SCOPE"),
        (struct.pack(">HBB", 1, 24, 0) + b"\x01\x02", "ADDRESS length"),
        (struct.pack(">HBB", 1, 20, 0) + b"\x01\x02\x0f", "beyond SOURCE"),
        (b"\x00\x01", "shorter than 4"),
    ],
)
def test_malformed_ecs_is_formerr(option: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message) as info:
        wire.parse_query(ecs_query(option))
    assert info.value.rcode is Rcode.FORMERR
    reply = dns.message.from_wire(wire.error_response(info.value))  # type: ignore[arg-type]
    assert reply.rcode() == dns.rcode.FORMERR
    assert reply.edns == 0  # the OPT is echoed


def test_ecs_with_source_zero_is_valid() -> None:
    q = wire.parse_query(ecs_query(struct.pack(">HBB", 1, 0, 0)))
    assert q.ecs == wire.ClientSubnet(1, 0, 0, b"")


@pytest.mark.parametrize(
    ("mutate", "rcode"),
    [
        (lambda d: d[:2] + bytes([d[2] | 0x80]) + d[3:], None),  # a response: no answer
        (lambda d: d[:2] + bytes([d[2] | 0x28]) + d[3:], Rcode.NOTIMP),  # opcode 5 (UPDATE)
        (lambda d: d[:4] + b"\x00\x02" + d[6:], Rcode.FORMERR),  # QDCOUNT 2
        (lambda d: d[:4] + b"\x00\x00" + d[6:], Rcode.FORMERR),  # QDCOUNT 0
        (lambda d: d[:6] + b"\x00\x01" + d[8:], Rcode.FORMERR),  # ANCOUNT 1
        (lambda d: d[:-3], Rcode.FORMERR),  # truncated question
        (lambda d: d + b"\x00", Rcode.FORMERR),  # trailing junk
        (lambda d: d[:12] + b"\xc0\x0c" + d[-4:], Rcode.FORMERR),  # compressed qname
        (lambda d: d[:11], None),  # shorter than a header
    ],
)
def test_bad_queries(mutate, rcode: Rcode | None) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WireError) as info:
        wire.parse_query(mutate(query()))
    reply = wire.error_response(info.value)
    if rcode is None:
        assert reply is None
    else:
        assert reply is not None
        assert int(dns.message.from_wire(reply, question_only=True).rcode()) == int(rcode)


def test_two_opt_records_are_formerr() -> None:
    data = bytearray(query(use_edns=0))
    data[11] = 2
    opt = bytes(data[-11:])
    with pytest.raises(WireError, match="second OPT"):
        wire.parse_query(bytes(data) + opt)


def test_response_truncates_when_too_big() -> None:
    q = wire.parse_query(query())
    body = b"".join(wire.rr(wire.QNAME_POINTER, 1, 30, bytes([10, 0, 0, i])) for i in range(40))
    small = dns.message.from_wire(wire.response(q, 0, 40, 0, body, max_size=512))
    assert small.flags & dns.flags.TC
    assert not small.answer
    big = dns.message.from_wire(wire.response(q, 0, 40, 0, body, max_size=65535))
    assert not big.flags & dns.flags.TC
    assert len(big.answer[0]) == 40
    assert big.flags & dns.flags.AA
    assert big.id == q.id


def test_response_echoes_ecs_with_scope() -> None:
    q = wire.parse_query(query(use_edns=0, options=[dns.edns.ECSOption("81.2.69.0", 24)]))
    reply = dns.message.from_wire(wire.response(q, 0, 0, 0, b"", max_size=1232, ecs_scope=20))
    (option,) = reply.options
    assert isinstance(option, dns.edns.ECSOption)
    assert (option.address, option.srclen, option.scopelen) == ("81.2.69.0", 24, 20)


def test_badvers_uses_the_extended_rcode() -> None:
    q = wire.parse_query(query(use_edns=0))
    reply = dns.message.from_wire(wire.response(q, Rcode.BADVERS, 0, 0, b"", max_size=1232))
    assert reply.rcode() == dns.rcode.BADVERS

"""The hand-written DNS wire code (global_lb.dns.wire) against dnspython, the reference.

Random queries built by dnspython (names, types, classes, EDNS payload and version,
Client Subnet options of both families and every prefix length) parse to the same
fields; responses assembled for them parse back with dnspython to the same question,
ECS option and scope; and a mutated query that our parser accepts is one dnspython
reads the same way.
"""

from __future__ import annotations

import ipaddress

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rdataclass
import dns.rdatatype
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from global_lb.dns import wire
from global_lb.dns.wire import Query, WireError

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same cases every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

labels = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-",
    min_size=1,
    max_size=20,
)
names = st.lists(labels, min_size=0, max_size=5).map(lambda parts: ".".join([*parts, ""]) or ".")
types = st.sampled_from(["A", "AAAA", "SOA", "NS", "ANY", "TXT", "MX", "AXFR"])
classes = st.sampled_from(["IN", "CH"])


@st.composite
def subnets(draw: st.DrawFn) -> dns.edns.ECSOption:
    v6 = draw(st.booleans())
    width = 128 if v6 else 32
    source = draw(st.integers(0, width))
    value = draw(st.integers(0, (1 << width) - 1))
    # dnspython masks the address to the source prefix itself.
    address = ipaddress.IPv6Address(value) if v6 else ipaddress.IPv4Address(value)
    return dns.edns.ECSOption(str(address), source)


@st.composite
def queries(draw: st.DrawFn) -> dns.message.QueryMessage:
    edns = draw(st.sampled_from([None, 0, 1]))
    options: list[dns.edns.Option] = (
        [draw(subnets())] if edns is not None and draw(st.booleans()) else []
    )
    query = dns.message.make_query(
        draw(names),
        draw(types),
        draw(classes),
        use_edns=edns,
        payload=draw(st.integers(0, 65535)),
        options=options,
        want_dnssec=draw(st.booleans()) if edns is not None else False,
    )
    query.id = draw(st.integers(0, 65535))
    if not draw(st.booleans()):
        query.flags &= ~dns.flags.RD
    return query


def assert_same(ours: Query, reference: dns.message.Message, raw: bytes) -> None:
    (question,) = reference.question
    assert ours.id == reference.id
    assert ours.flags == reference.flags
    assert ours.qname == (question.name.to_wire() or b"").lower()
    assert ours.qtype == question.rdtype
    assert ours.qclass == question.rdclass
    assert ours.question == raw[12 : 12 + len(ours.question)]
    assert ours.edns == (reference.edns >= 0)
    if reference.edns >= 0:
        assert ours.edns_version == reference.edns
        assert ours.payload == max(512, reference.payload)
    ecs = [o for o in reference.options if isinstance(o, dns.edns.ECSOption)]
    if ecs:
        (option,) = ecs
        assert ours.ecs is not None
        assert ours.ecs.family == option.family
        assert ours.ecs.source == option.srclen
        padded = ipaddress.ip_address(ours.ecs.padded())
        assert padded == ipaddress.ip_address(option.address)
    else:
        assert ours.ecs is None


@SETTINGS
@given(queries())
def test_queries_parse_like_dnspython(query: dns.message.QueryMessage) -> None:
    raw = query.to_wire()
    ours = wire.parse_query(raw)
    assert_same(ours, dns.message.from_wire(raw), raw)


@SETTINGS
@given(queries(), st.integers(0, 255), st.integers(512, 65535))
def test_responses_read_back_with_dnspython(
    query: dns.message.QueryMessage, scope: int, max_size: int
) -> None:
    raw = query.to_wire()
    ours = wire.parse_query(raw)
    width = 0 if ours.ecs is None else (32 if ours.ecs.family == 1 else 128)
    ecs_scope = None if ours.ecs is None else min(scope, width)
    answer = wire.rr(wire.QNAME_POINTER, wire.QType.A, 30, bytes([192, 0, 2, 1]))
    reply_raw = wire.response(ours, 0, 1, 0, answer, max_size=max_size, ecs_scope=ecs_scope)
    reply = dns.message.from_wire(reply_raw)
    assert reply.id == query.id
    assert reply.flags & dns.flags.QR
    assert reply.question == query.question  # echoed verbatim (0x20 case kept)
    assert reply.edns == (0 if ours.edns else -1)
    if ours.ecs is not None and ours.edns:
        (option,) = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
        assert option.scopelen == ecs_scope
        assert option.srclen == ours.ecs.source
    if len(reply_raw) < max_size and not reply.flags & dns.flags.TC:
        assert [r.to_text() for rrset in reply.answer for r in rrset] == ["192.0.2.1"]


@SETTINGS
@given(queries(), st.lists(st.tuples(st.integers(0, 600), st.integers(0, 255)), max_size=4))
def test_a_mutated_query_we_accept_is_one_dnspython_reads_alike(
    query: dns.message.QueryMessage, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(query.to_wire())
    for position, value in flips:
        data[position % len(data)] = value
    raw = bytes(data)
    try:
        ours = wire.parse_query(raw)
    except WireError:
        return  # refused with an RCODE (or dropped): the server tests cover those
    try:
        reference = dns.message.from_wire(raw)
    except dns.exception.DNSException:
        # dnspython is stricter in places (e.g. names or rdata of records we skip);
        # what we accepted must still be a readable query header and question.
        assert len(raw) >= 12 + len(ours.question)
        return
    if len(reference.question) == 1 and not reference.answer and not reference.authority:
        assert_same(ours, reference, raw)

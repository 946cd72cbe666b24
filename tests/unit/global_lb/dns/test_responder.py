from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import dns.edns
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import pytest

from global_lb.dns.responder import Responder
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.zone import NameServer, ZoneConfig
from global_lb.geo import ChainLocator, MaxMindLocator
from global_lb.metrics import GlobalMetrics
from global_lb.router import GlobalRouter
from global_lb.view import GlobalView
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from tests.unit.global_lb.helpers import address_of, view, write_city_db

RESOLVER = ipaddress.ip_address("127.0.0.1")


class Harness:
    def __init__(self, tmp_path: Path, router: GlobalRouter, **zone: Any) -> None:
        self.view: GlobalView | None = view()
        self.registry = new_registry()
        self.clock = FakeClock()
        self.responder = Responder(
            ZoneConfig(
                name_servers=(NameServer(addresses=(ipaddress.ip_address("127.0.0.53"),)),), **zone
            ),
            view=lambda: self.view,
            router=router,
            locator=ChainLocator(MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))),
            metrics=GlobalMetrics(self.registry),
            clock=self.clock,
            rrl=RrlConfig(rate=0),
            # The SOA serial follows the wall clock: the test's, so two harnesses built
            # across a second's boundary still answer alike.
            wall=self.clock.wall,
        )

    def ask(
        self,
        name: str,
        rdtype: str = "A",
        subnet: tuple[str, int] | None = None,
        source: str = "127.0.0.1",
        udp: bool = True,
        **kw: object,
    ) -> dns.message.Message:
        options = [dns.edns.ECSOption(*subnet)] if subnet else []
        edns = 0 if (subnet or "use_edns" in kw) else None
        kw.pop("use_edns", None)
        q = dns.message.make_query(name, rdtype, use_edns=edns, options=options, **kw)  # type: ignore[arg-type]
        raw = self.responder.respond(q.to_wire(), ipaddress.ip_address(source), udp=udp)
        assert raw is not None
        reply = dns.message.from_wire(raw)
        assert reply.id == q.id
        return reply


@pytest.fixture
def h(tmp_path: Path, dns_router: GlobalRouter) -> Harness:
    return Harness(tmp_path, dns_router)


def addresses(reply: dns.message.Message) -> list[str]:
    return [rdata.to_text() for rrset in reply.answer for rdata in rrset]


def scope(reply: dns.message.Message) -> int:
    (option,) = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
    return option.scopelen


@pytest.mark.parametrize(
    ("subnet", "region"),
    [
        (("81.2.69.0", 24), "eu-west"),  # London
        (("216.160.83.0", 24), "us-west"),  # Seattle area
        (("198.51.100.0", 24), "eu-central"),  # Frankfurt
        (("2001:218::", 32), "ap-northeast"),  # Tokyo
    ],
)
def test_api_answers_the_nearest_region_with_the_network_as_scope(
    h: Harness, subnet: tuple[str, int], region: str
) -> None:
    reply = h.ask("api.inference.example.", subnet=subnet)
    assert reply.rcode() == dns.rcode.NOERROR
    assert reply.flags & dns.flags.AA
    assert addresses(reply) == [address_of(region)]
    assert scope(reply) == subnet[1]
    assert reply.answer[0].ttl == 30


def test_aaaa_answers_the_ipv6_endpoint(h: Harness) -> None:
    reply = h.ask("api.inference.example.", "AAAA", subnet=("2a02:c7f::", 48))
    assert addresses(reply) == [address_of("eu-central", 6)]
    assert scope(reply) == 32  # the database network is wider than the source


def test_scope_longer_than_source_when_the_source_spans_two_countries(h: Harness) -> None:
    # 203.0.113.0/24 is Tokyo (/25) and Singapore (/25): a /24 answer must not be cached
    # for the whole /24.
    reply = h.ask("api.inference.example.", subnet=("203.0.113.0", 24))
    assert scope(reply) == 25


def test_without_ecs_the_resolver_address_decides_and_no_option_is_sent(h: Harness) -> None:
    reply = h.ask("api.inference.example.", source="81.2.69.7")
    assert addresses(reply) == [address_of("eu-west")]
    assert reply.options == ()


def test_ecs_source_zero_gets_scope_zero(h: Harness) -> None:
    reply = h.ask("api.inference.example.", subnet=("0.0.0.0", 0), source="81.2.69.7")
    assert addresses(reply) == [address_of("eu-west")]
    assert scope(reply) == 0


def test_gdpr_client_is_never_answered_outside_the_eea(h: Harness) -> None:
    # Linköping, Sweden: GDPR applies; the nearest allowed regions are in the EEA.
    reply = h.ask("us.api.inference.example.", subnet=("89.160.20.0", 24))
    assert reply.rcode() == dns.rcode.NOERROR
    assert reply.answer == []  # NODATA
    assert reply.authority[0].rdtype == dns.rdatatype.SOA
    assert scope(reply) == 24
    assert addresses(h.ask("api.inference.example.", subnet=("89.160.20.0", 24))) in (
        [address_of("eu-west")],
        [address_of("eu-central")],
    )


def test_jurisdiction_and_region_names(h: Harness) -> None:
    assert addresses(h.ask("eu.api.inference.example.", subnet=("216.160.83.0", 24))) == [
        address_of("eu-west")
    ]
    assert addresses(h.ask("JP.api.inference.example.", subnet=("81.2.69.0", 24))) == [
        address_of("ap-northeast")
    ]
    assert addresses(h.ask("us-east.api.inference.example.", subnet=("81.2.69.0", 24))) == [
        address_of("us-east")
    ]


def test_unavailable_region_name_is_nodata(h: Harness) -> None:
    h.view = view(revision=2, down=["us-east"], drained=["eu-west"])
    for name in ("us-east.api.inference.example.", "eu-west.api.inference.example."):
        reply = h.ask(name, subnet=("81.2.69.0", 24))
        assert (reply.rcode(), reply.answer) == (dns.rcode.NOERROR, [])
        assert reply.authority[0].rdtype == dns.rdatatype.SOA


def test_answers_change_when_the_view_changes(h: Harness) -> None:
    assert addresses(h.ask("api.inference.example.", subnet=("81.2.69.0", 24))) == [
        address_of("eu-west")
    ]
    h.view = view(revision=2, down=["eu-west"])
    assert addresses(h.ask("api.inference.example.", subnet=("81.2.69.0", 24))) != [
        address_of("eu-west")
    ]


@pytest.mark.parametrize(
    ("name", "rdtype", "rcode"),
    [
        ("nope.inference.example.", "A", dns.rcode.NXDOMAIN),
        ("x.eu-west.api.inference.example.", "A", dns.rcode.NXDOMAIN),
        ("example.com.", "A", dns.rcode.REFUSED),
        ("xinference.example.", "A", dns.rcode.REFUSED),
        ("api.inference.example.", "AXFR", dns.rcode.REFUSED),
    ],
)
def test_error_codes(h: Harness, name: str, rdtype: str, rcode: int) -> None:
    reply = h.ask(name, rdtype)
    assert reply.rcode() == rcode
    if rcode == dns.rcode.NXDOMAIN:
        assert reply.authority[0].rdtype == dns.rdatatype.SOA
        assert reply.authority[0].name.to_text() == "inference.example."


def test_refused_for_another_class(h: Harness) -> None:
    assert h.ask("api.inference.example.", "A", rdclass="CH").rcode() == dns.rcode.REFUSED


def test_apex_soa_ns_and_name_server_address(h: Harness) -> None:
    soa = h.ask("inference.example.", "SOA")
    assert soa.answer[0][0].mname.to_text() == "ns1.inference.example."
    assert soa.answer[0][0].minimum == 30
    ns = h.ask("inference.example.", "NS")
    assert [r.to_text() for r in ns.answer[0]] == ["ns1.inference.example."]
    assert addresses(h.ask("ns1.inference.example.")) == ["127.0.0.53"]
    assert h.ask("inference.example.", "A").answer == []


def test_any_gets_a_minimal_hinfo(h: Harness) -> None:
    reply = h.ask("api.inference.example.", "ANY")
    (rrset,) = reply.answer
    assert rrset.rdtype == dns.rdatatype.HINFO
    assert rrset[0].cpu == b"RFC8482"


def test_other_types_on_existing_names_are_nodata(h: Harness) -> None:
    reply = h.ask("api.inference.example.", "TXT")
    assert (reply.rcode(), reply.answer) == (dns.rcode.NOERROR, [])


def test_edns_version_1_is_badvers(h: Harness) -> None:
    q = dns.message.make_query("api.inference.example.", "A", use_edns=1)
    reply = dns.message.from_wire(h.responder.respond(q.to_wire(), RESOLVER) or b"")
    assert reply.rcode() == dns.rcode.BADVERS


def test_no_view_yet_is_servfail(h: Harness) -> None:
    h.view = None
    assert h.ask("api.inference.example.").rcode() == dns.rcode.SERVFAIL


def test_rate_limiting_drops_and_slips(tmp_path: Path, dns_router: GlobalRouter) -> None:
    h = Harness(tmp_path, dns_router)
    h.responder._rrl = type(h.responder._rrl)(RrlConfig(rate=2, slip=2), h.clock)
    wire = dns.message.make_query("api.inference.example.", "A").to_wire()
    replies = [h.responder.respond(wire, RESOLVER, udp=True) for _ in range(6)]
    assert [r is not None for r in replies] == [True, True, False, True, False, True]
    slipped = dns.message.from_wire(replies[3])  # type: ignore[arg-type]
    assert slipped.flags & dns.flags.TC
    assert not slipped.answer
    assert h.responder.respond(wire, RESOLVER, udp=False) is not None  # TCP is never limited


def test_metrics_count_answers_by_name_region_and_rcode(h: Harness) -> None:
    h.ask("api.inference.example.", subnet=("81.2.69.0", 24))
    h.ask("api.inference.example.", subnet=("81.2.69.0", 24))
    h.ask("nope.inference.example.")
    h.responder.flush_counts()  # the fast path counts in batches (the tier: every second)
    sample = h.registry.get_sample_value
    assert (
        sample(
            "gtm_global_dns_responses_total",
            {"kind": "api", "region": "eu-west", "rcode": "NOERROR"},
        )
        == 2
    )
    assert (
        sample(
            "gtm_global_dns_responses_total", {"kind": "other", "region": "", "rcode": "NXDOMAIN"}
        )
        == 1
    )
    assert sample("gtm_global_dns_ecs_scope_total", {"family": "ipv4", "scope": "24"}) == 2


def test_fast_path_answers_are_counted_at_each_flush_over_both_transports(h: Harness) -> None:
    labels = {"kind": "api", "region": "eu-west", "rcode": "NOERROR"}
    scope = {"family": "ipv4", "scope": "24"}
    sample = h.registry.get_sample_value
    h.ask("api.inference.example.", subnet=("81.2.69.0", 24))  # slow path: counted at once
    assert sample("gtm_global_dns_responses_total", labels) == 1
    for udp in (True, True, False, False, False):  # fast path (TCP's first is slow)
        h.ask("api.inference.example.", subnet=("81.2.69.0", 24), udp=udp)
    assert sample("gtm_global_dns_responses_total", labels) == 2
    h.responder.flush_counts()
    assert sample("gtm_global_dns_responses_total", labels) == 6
    assert sample("gtm_global_dns_ecs_scope_total", scope) == 6
    h.responder.flush_counts()  # nothing new: nothing added twice
    assert sample("gtm_global_dns_responses_total", labels) == 6


def test_too_many_addresses_truncate_over_udp_but_not_tcp(
    tmp_path: Path, dns_router: GlobalRouter
) -> None:
    from dataclasses import replace

    from gtm.models import Endpoint

    h = Harness(tmp_path, dns_router, max_addresses=64)
    base = view()
    many = tuple(
        Endpoint(url=f"http://[fd00::{i:x}]:80", address=ipaddress.ip_address(f"fd00::{i:x}"))
        for i in range(1, 41)
    )
    regions = tuple(replace(r, endpoints=many) if r.id == "eu-west" else r for r in base.regions)
    h.view = replace(base, regions=regions)
    udp = h.ask("eu-west.api.inference.example.", "AAAA", subnet=("81.2.69.0", 24), payload=512)
    assert udp.flags & dns.flags.TC
    assert udp.answer == []
    tcp = h.ask("eu-west.api.inference.example.", "AAAA", subnet=("81.2.69.0", 24), udp=False)
    assert len(tcp.answer[0]) == 40


def test_internal_errors_cost_one_servfail(h: Harness) -> None:
    def broken() -> GlobalView:
        raise RuntimeError("boom")

    h.responder._view_source = broken
    assert h.ask("api.inference.example.").rcode() == dns.rcode.SERVFAIL


def test_fast_path_repeats_answers_per_resolver_when_the_resolver_decides(h: Harness) -> None:
    wire_query = dns.message.make_query("api.inference.example.", "A").to_wire()
    london = h.responder.respond(wire_query, ipaddress.ip_address("81.2.69.7"))
    seattle = h.responder.respond(wire_query, ipaddress.ip_address("216.160.83.9"))
    again = h.responder.respond(wire_query, ipaddress.ip_address("81.2.69.7"))
    assert london is not None
    assert seattle is not None
    assert addresses(dns.message.from_wire(london)) == [address_of("eu-west")]
    assert addresses(dns.message.from_wire(seattle)) == [address_of("us-west")]
    assert again == london
    h.responder.flush_counts()
    sample = h.registry.get_sample_value
    labels = {"kind": "api", "region": "eu-west", "rcode": "NOERROR"}
    assert sample("gtm_global_dns_responses_total", labels) == 2  # the fast path counts too


def test_fast_path_keeps_the_query_id(h: Harness) -> None:
    first = dns.message.make_query("api.inference.example.", "A", use_edns=0)
    second = dns.message.make_query("api.inference.example.", "A", use_edns=0)
    second.id = (first.id + 1) % 65536
    replies = [
        dns.message.from_wire(h.responder.respond(q.to_wire(), RESOLVER) or b"")
        for q in (first, second)
    ]
    assert [r.id for r in replies] == [first.id, second.id]


UDP_QUERIES = [
    dns.message.make_query(
        "api.inference.example.", "A", use_edns=0, options=[dns.edns.ECSOption("81.2.69.0", 24)]
    ).to_wire(),
    dns.message.make_query("api.inference.example.", "A").to_wire(),  # the resolver decides
    dns.message.make_query("eu.api.inference.example.", "AAAA", use_edns=0).to_wire(),
    dns.message.make_query("nope.inference.example.", "A").to_wire(),
    dns.message.make_query("example.org.", "A").to_wire(),
    dns.message.make_query("api.inference.example.", "ANY").to_wire(),
    b"\x12\x34\x01\x00\x00\x01",  # cut short: FORMERR
]


@pytest.mark.parametrize("rate", [0.0, 3.0])
def test_respond_udp_answers_exactly_like_respond(
    tmp_path: Path, dns_router: GlobalRouter, rate: float
) -> None:
    """The UDP loops' entry point (fast path inlined) against ``respond(udp=True)``:
    same bytes, twice over (slow path, then cached), from two resolvers, with and
    without rate limiting."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    inlined = Harness(tmp_path / "a", dns_router)
    reference = Harness(tmp_path / "b", dns_router)
    for harness in (inlined, reference):
        harness.responder._rrl = type(harness.responder._rrl)(
            RrlConfig(rate=rate, slip=2), harness.clock
        )
    for source in ("81.2.69.7", "216.160.83.9"):
        client = ipaddress.ip_address(source)
        for _ in range(2):
            for query in UDP_QUERIES:
                got = inlined.responder.respond_udp(query, client)
                assert got == reference.responder.respond(query, client, udp=True)
    inlined.responder.flush_counts()
    reference.responder.flush_counts()
    for name in ("gtm_global_dns_responses_total", "gtm_global_dns_dropped_total"):
        assert _totals(inlined, name) == _totals(reference, name)
    if rate:
        assert _totals(inlined, "gtm_global_dns_dropped_total")  # the limit was reached


def _totals(h: Harness, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in h.registry.collect()
        for s in family.samples
        if s.name == name
    }


def test_udp_table_entries_point_at_their_bytes_and_a_full_table_is_replaced(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batched loop sends a hit's bytes from ``address`` without a copy: each entry
    must describe its own bytes, and a table handed out must keep its entries (a full
    table is replaced, never emptied) so those bytes live while a batch holds it."""
    import ctypes

    from global_lb.dns import responder as module

    monkeypatch.setattr(module, "MAX_PACKETS", 2)
    names = ["api.inference.example.", "eu.api.inference.example.", "nope.inference.example."]
    queries = [dns.message.make_query(n, "A", use_edns=0).to_wire() for n in names]
    h.responder.respond(queries[0], RESOLVER)
    h.responder.respond(queries[1], RESOLVER)
    table = h.responder.udp_table()
    assert table is not None
    held, _ = table
    before = dict(held)
    assert set(before) == {q[2:] for q in queries[:2]}
    h.responder.respond(queries[2], RESOLVER)  # the table is full: a new one
    assert dict(held) == before  # the old one is untouched
    fresh = h.responder.udp_table()
    assert fresh is not None
    assert fresh[0] is not held
    assert set(fresh[0]) == {queries[2][2:]}
    for entry in (*before.values(), *fresh[0].values()):
        assert entry.size == len(entry.tail)
        assert ctypes.string_at(entry.address, entry.size) == entry.tail

"""The zone's NS set, glue and SOA: what a parent zone's delegation relies on."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import dns.edns
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rdtypes.ANY.SOA
import pytest
from pydantic import ValidationError

from global_lb.dns.responder import Responder
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.zone import NameServer, SerialPolicy, ZoneConfig
from global_lb.geo import ChainLocator, MaxMindLocator
from global_lb.metrics import GlobalMetrics
from global_lb.router import GlobalRouter
from global_lb.view import GlobalView
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from tests.unit.global_lb.helpers import view, write_city_db

ZONE = "gtm.example.com."
DELEGATED = ZoneConfig(
    zone=ZONE,
    ttl=30,
    negative_ttl=15,
    name_servers=(
        NameServer(name="ns1", addresses=(ipaddress.ip_address("192.0.2.53"),)),
        NameServer(
            name="ns2.gtm.example.com.",
            addresses=(
                ipaddress.ip_address("2001:db8::53"),
                ipaddress.ip_address("198.51.100.53"),
            ),
        ),
        NameServer(name="ns.provider.net."),
    ),
    hostmaster="dns.admin@example.com",
    serial_policy=SerialPolicy.FIXED,
    serial=2026112601,
    refresh=7200,
    retry=900,
    expire=1_209_600,
)


class Zone:
    def __init__(self, tmp_path: Path, router: GlobalRouter, config: ZoneConfig) -> None:
        self.view: GlobalView | None = view()
        self.wall = 1_800_000_000.0
        self.responder = Responder(
            config,
            view=lambda: self.view,
            router=router,
            locator=ChainLocator(MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))),
            metrics=GlobalMetrics(new_registry()),
            clock=FakeClock(),
            rrl=RrlConfig(rate=0),
            wall=lambda: self.wall,
        )

    def ask(self, name: str, rdtype: str = "A", ecs: bool = False) -> dns.message.Message:
        options: list[dns.edns.Option] = [dns.edns.ECSOption("81.2.69.0", 24)] if ecs else []
        query = dns.message.make_query(name, rdtype, use_edns=0, options=options)
        raw = self.responder.respond(query.to_wire(), ipaddress.ip_address("127.0.0.1"))
        assert raw is not None
        return dns.message.from_wire(raw)


@pytest.fixture
def zone(tmp_path: Path, dns_router: GlobalRouter) -> Zone:
    return Zone(tmp_path, dns_router, DELEGATED)


def soa_of(rrset: dns.rrset.RRset) -> dns.rdtypes.ANY.SOA.SOA:
    assert rrset.rdtype == dns.rdatatype.SOA
    (soa,) = list(rrset)
    assert isinstance(soa, dns.rdtypes.ANY.SOA.SOA)
    return soa


def test_ns_answer_is_the_configured_set_with_glue_for_in_zone_names(zone: Zone) -> None:
    reply = zone.ask(ZONE, "NS")
    assert reply.rcode() == dns.rcode.NOERROR
    (ns,) = reply.answer
    assert [r.to_text() for r in ns] == [
        "ns1.gtm.example.com.",
        "ns2.gtm.example.com.",
        "ns.provider.net.",
    ]
    glue = {(r.name.to_text(), r.rdtype, rd.to_text()) for r in reply.additional for rd in r}
    assert glue == {
        ("ns1.gtm.example.com.", dns.rdatatype.A, "192.0.2.53"),
        ("ns2.gtm.example.com.", dns.rdatatype.A, "198.51.100.53"),
        ("ns2.gtm.example.com.", dns.rdatatype.AAAA, "2001:db8::53"),
    }  # nothing for the out-of-zone server: its addresses are its own zone's
    assert all(r.ttl == 30 for r in reply.additional)


def test_in_zone_name_servers_answer_their_addresses(zone: Zone) -> None:
    assert [r.to_text() for r in zone.ask("ns2.gtm.example.com.", "AAAA").answer[0]] == [
        "2001:db8::53"
    ]
    nodata = zone.ask("ns1.gtm.example.com.", "AAAA")
    assert nodata.rcode() == dns.rcode.NOERROR
    assert nodata.answer == []
    assert zone.ask("ns.provider.net.", "A").rcode() == dns.rcode.REFUSED


def test_soa_answer_carries_every_configured_field(zone: Zone) -> None:
    reply = zone.ask(ZONE, "SOA")
    (rrset,) = reply.answer
    soa = soa_of(rrset)
    assert soa.mname.to_text() == "ns1.gtm.example.com."
    assert soa.rname.to_text() == "dns\\.admin.example.com."  # RFC 1035 §8 mailbox
    assert (soa.serial, soa.refresh, soa.retry, soa.expire, soa.minimum) == (
        2026112601, 7200, 900, 1_209_600, 15,
    )  # fmt: skip
    assert rrset.ttl == 30


@pytest.mark.parametrize(
    ("name", "rdtype", "rcode"),
    [
        ("nothing.gtm.example.com.", "A", dns.rcode.NXDOMAIN),
        ("gtm.example.com.", "A", dns.rcode.NOERROR),  # NODATA at the apex
        ("ns1.gtm.example.com.", "AAAA", dns.rcode.NOERROR),  # NODATA at a name server
        ("us.api.gtm.example.com.", "TXT", dns.rcode.NOERROR),  # NODATA, routed name
    ],
)
def test_negative_answers_close_with_the_soa_for_negative_caching(
    zone: Zone, name: str, rdtype: str, rcode: int
) -> None:
    reply = zone.ask(name, rdtype, ecs=True)
    assert reply.rcode() == rcode
    assert reply.answer == []
    (rrset,) = reply.authority
    assert rrset.name.to_text() == ZONE
    soa = soa_of(rrset)
    # RFC 2308 §3/§5: cached for min(SOA TTL, MINIMUM): the MINIMUM, 15 s, both ways.
    assert rrset.ttl == 15 == soa.minimum
    assert soa.serial == 2026112601


def test_a_minimum_longer_than_the_ttl_is_the_negative_caching_time(
    tmp_path: Path, dns_router: GlobalRouter
) -> None:
    zone = Zone(tmp_path, dns_router, ZoneConfig(zone=ZONE, ttl=30, negative_ttl=300))
    (rrset,) = zone.ask(f"nothing.{ZONE}").authority
    assert (rrset.ttl, soa_of(rrset).minimum) == (300, 300)
    assert zone.ask(ZONE, "SOA").answer[0].ttl == 30  # the SOA asked for: the zone's TTL


def test_the_default_zone_is_unchanged(tmp_path: Path, dns_router: GlobalRouter) -> None:
    zone = Zone(tmp_path, dns_router, ZoneConfig())
    reply = zone.ask("inference.example.", "NS")
    assert [r.to_text() for r in reply.answer[0]] == ["ns1.inference.example."]
    assert reply.additional == []  # no addresses configured: no glue to give
    soa = soa_of(zone.ask("inference.example.", "SOA").answer[0])
    assert soa.rname.to_text() == "hostmaster.inference.example."
    assert (soa.refresh, soa.retry, soa.expire, soa.minimum) == (3600, 600, 604_800, 30)


def test_unixtime_serial_moves_with_the_view_and_never_back(
    tmp_path: Path, dns_router: GlobalRouter
) -> None:
    zone = Zone(tmp_path, dns_router, ZoneConfig(zone=ZONE))
    first = soa_of(zone.ask(ZONE, "SOA").answer[0]).serial
    assert first == 1_800_000_000
    zone.view = view()  # a new view: the answers may have changed
    zone.wall -= 100  # the wall clock stepped back
    assert soa_of(zone.ask(ZONE, "SOA").answer[0]).serial == first + 1


def test_fixed_serial_stays_across_views(zone: Zone) -> None:
    zone.view = view()
    assert soa_of(zone.ask(ZONE, "SOA").answer[0]).serial == 2026112601


def test_explicit_primary_is_the_mname(tmp_path: Path, dns_router: GlobalRouter) -> None:
    config = DELEGATED.model_copy(update={"primary": "ns.provider.net."})
    zone = Zone(tmp_path, dns_router, ZoneConfig.model_validate(config.model_dump()))
    assert soa_of(zone.ask(ZONE, "SOA").answer[0]).mname.to_text() == "ns.provider.net."


def test_glue_that_does_not_fit_sets_tc(tmp_path: Path, dns_router: GlobalRouter) -> None:
    many = tuple(
        NameServer(
            name=f"ns{i}",
            addresses=tuple(ipaddress.ip_address(f"2001:db8::{i}:{j}") for j in range(1, 9)),
        )
        for i in range(1, 9)
    )
    zone = Zone(tmp_path, dns_router, ZoneConfig(zone=ZONE, name_servers=many))
    query = dns.message.make_query(ZONE, "NS")  # no EDNS: 512 bytes
    raw = zone.responder.respond(query.to_wire(), ipaddress.ip_address("127.0.0.1"))
    assert raw is not None
    reply = dns.message.from_wire(raw)
    assert reply.flags & dns.flags.TC  # retried over TCP, where the whole glue fits
    raw = zone.responder.respond(query.to_wire(), ipaddress.ip_address("127.0.0.1"), udp=False)
    assert raw is not None
    assert sum(len(r) for r in dns.message.from_wire(raw).additional) == 64


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"name_servers": ()}, "name_servers"),
        ({"name_servers": ({"name": "ns1.dns"},)}, "one label under the zone"),
        ({"name_servers": ({"name": "ns1.dns.gtm.example.com."},)}, "one label directly"),
        ({"name_servers": ({"name": "api"},)}, "'api' is the routed name"),
        ({"name_servers": ({"name": "ns_1"},)}, "'ns_1' is not a host name"),
        ({"primary": "ns-.example.net."}, "primary: 'ns-.example.net.' is not a host name"),
        ({"name_servers": ({"name": "ns1"}, {"name": "ns1.gtm.example.com."})}, "twice"),
        (
            {"name_servers": ({"name": "ns.provider.net.", "addresses": ("192.0.2.1",)},)},
            "outside the zone",
        ),
        ({"name_servers": ({"name": "ns1", "addresses": ("no-ip",)},)}, "addresses"),
        ({"hostmaster": "@example.com"}, "hostmaster: '@example.com' is not a mailbox"),
        ({"hostmaster": "a..b"}, "hostmaster"),
        ({"primary": "x..y."}, "primary"),
        ({"refresh": 3600, "retry": 600, "expire": 3000}, "expire: 3000 s is shorter"),
        ({"serial": 1 << 32}, "serial"),
        ({"refresh": 0}, "refresh"),
    ],
)
def test_bad_zone_settings_are_errors_naming_the_field(
    fields: dict[str, object], error: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        ZoneConfig.model_validate({"zone": ZONE, **fields})
    assert error in str(caught.value)


def test_the_old_field_name_label_still_reads() -> None:
    assert NameServer.model_validate({"label": "ns7"}).name == "ns7"

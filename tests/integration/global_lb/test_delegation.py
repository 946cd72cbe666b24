"""A client behind a real recursive resolver: Debian's ``unbound`` with its subnet cache
module, in front of a real ``gtm global`` serving a delegated zone (``--ns``/``--soa-*``
and ``GTM_`` variables) — the path of docs/dns-delegation.md, on loopback.

unbound reaches the zone through a ``stub-zone`` (a parent's delegation would name
port 53; the stub names gtm's port). ``client-subnet-always-forward`` passes the
client's EDNS Client Subnet option on to gtm, and the subnet cache keeps each answer
for the scope gtm returned: a client in another region's network must get its own
answer, never the cached one.

Needs ``unbound`` (``scripts/install-system-deps``): without it this test fails.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator

import dns.edns
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from tests.integration.global_lb.daemons import (
    DNS_LISTENING,
    Resolver,
    free_port,
    gtm_global,
    health_endpoint,
    running,
    unbound_binary,
    unbound_conf,
    write_topology,
)
from tests.unit.global_lb.helpers import REGION_IDS, address_of, maxmind_test_db

pytestmark = pytest.mark.integration

ZONE = "gtm.example."


@pytest.fixture(scope="module")
def resolver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resolver]:
    binary = unbound_binary()
    tmp = tmp_path_factory.mktemp("delegation")
    with health_endpoint() as health_port:
        topo = write_topology(tmp / "topology.yaml", health_port)
        gtm_port, unbound_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GTM_")}
        # Some settings by flag, some by variable: both reach the zone.
        env |= {"GTM_SOA_SERIAL": "2026112601", "GTM_SOA_MINIMUM": "20"}
        gtm = gtm_global(
            "--dns-listen", f"127.0.0.1:{gtm_port}", "--http-listen", "off",
            "--state", "memory", "--topology", str(topo), "--rrl-rate", "0",
            "--geoip-db", str(maxmind_test_db("GeoIP2-City-Test")),
            "--zone", ZONE, "--ttl", "60",
            "--ns", "ns1=127.0.0.1", "--ns", "ns2.gtm.example.=127.0.0.2,::1",
            "--ns", "ns.provider.example.",
            "--soa-rname", "dns-admin@example.com",
        )  # fmt: skip
        with running(gtm, env, DNS_LISTENING):
            conf = unbound_conf(tmp, unbound_port, gtm_port, ZONE)
            with running([binary, "-d", "-c", str(conf)], env, "start of service"):
                yield Resolver(unbound_port)


def addresses(reply: dns.message.Message) -> list[str]:
    return sorted(rd.to_text() for rrset in reply.answer for rd in rrset)


def ecs_scope(reply: dns.message.Message) -> int:
    (option,) = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
    return int(option.scopelen)


#: Clients in turn, each behind the same resolver: (ECS subnet, type, region, scope).
CLIENTS = (
    (("2.2.3.0", 24), "A", "eu-west", 24),  # Oxford, GB: its /24 in the database
    (("214.78.120.0", 24), "A", "us-west", 22),  # San Diego: the database's /22
    (("214.78.121.0", 24), "A", "us-west", 22),  # same /22: unbound may answer from cache
    (("2001:218::", 48), "AAAA", "ap-northeast", 32),  # Tokyo: the database's /32
    (("2.2.3.0", 24), "A", "eu-west", 24),  # not an answer cached for another client
)


def test_clients_behind_unbound_get_their_regions_answer_and_scope(resolver: Resolver) -> None:
    for subnet, rdtype, region, scope in CLIENTS:
        reply = resolver.ask(f"api.{ZONE}", rdtype, subnet)
        assert reply.rcode() == dns.rcode.NOERROR, subnet
        assert addresses(reply) == [address_of(region, 6 if rdtype == "AAAA" else 4)], subnet
        assert ecs_scope(reply) == scope, subnet
        assert 0 < reply.answer[0].ttl <= 60


def test_every_region_name_resolves_through_unbound(resolver: Resolver) -> None:
    for region in REGION_IDS:
        reply = resolver.ask(f"{region}.api.{ZONE}", "A", ("2.2.3.0", 24))
        assert addresses(reply) == [address_of(region)], region


def test_the_ns_set_and_soa_through_unbound(resolver: Resolver) -> None:
    ns = resolver.ask(ZONE, "NS")
    assert ns.rcode() == dns.rcode.NOERROR
    assert sorted(rd.to_text() for rd in ns.answer[0]) == [
        "ns.provider.example.",
        "ns1.gtm.example.",
        "ns2.gtm.example.",
    ]
    glue = resolver.ask(f"ns2.{ZONE}", "AAAA")
    assert addresses(glue) == ["::1"]
    soa = resolver.ask(ZONE, "SOA").answer[0][0]
    assert soa.mname.to_text() == "ns1.gtm.example."
    assert soa.rname.to_text() == "dns-admin.example.com."
    assert (soa.serial, soa.minimum) == (2026112601, 20)


def test_negative_answers_carry_the_soa_and_its_minimum(resolver: Resolver) -> None:
    nx = resolver.ask(f"nowhere.{ZONE}", "A")
    assert nx.rcode() == dns.rcode.NXDOMAIN
    (authority,) = nx.authority
    assert authority.rdtype == dns.rdatatype.SOA
    assert authority.name.to_text() == ZONE
    assert 0 < authority.ttl <= 20  # RFC 2308: cached for the SOA MINIMUM at most
    nodata = resolver.ask(f"api.{ZONE}", "TXT")
    assert nodata.rcode() == dns.rcode.NOERROR
    assert nodata.answer == []
    assert nodata.authority[0].rdtype == dns.rdatatype.SOA


def test_a_client_without_ecs_is_answered_for_unbounds_own_view(resolver: Resolver) -> None:
    """No ECS option from the client: unbound sends its loopback client's /24, a network
    gtm has no location for (special-purpose): some region is answered, never an error."""
    reply = resolver.ask(f"api.{ZONE}", "A")
    assert reply.rcode() == dns.rcode.NOERROR
    (address,) = addresses(reply)
    assert ipaddress.ip_address(address) in ipaddress.ip_network("127.0.1.0/24")

"""A deployment's GeoDNS hung under a resolver, as an operator delegates it (issue 23,
item 4; docs/dns-delegation.md).

``gtm up --processes`` with its zone's NS set and SOA given (``--dns-ns``,
``--dns-soa-*``, passed to its ``gtm global`` child), and Debian's ``unbound`` in front
as the clients' recursive resolver, its subnet cache module forwarding their EDNS Client
Subnet. Driven from the client's side: a client in Oxford and one in San Diego, behind the
same resolver, each get their own region and the scope of the network that placed them;
the NS answer carries the configured set with its glue, the SOA the configured fields,
and a name that does not exist the SOA whose MINIMUM bounds its negative caching.

Before, ``gtm up`` had no zone options (the command stopped at ``--dns-ns``), and the
zone's NS set was ``ns1.<zone>`` without an address.
"""

from __future__ import annotations

import os
from pathlib import Path

import dns.edns
import dns.message
import dns.rcode
import dns.rdatatype
import pytest

from tests.integration.global_lb.daemons import (
    Resolver,
    free_port,
    running,
    unbound_binary,
    unbound_conf,
)
from tests.integration.gtmctl.up.helpers import running_up
from tests.unit.global_lb.helpers import maxmind_test_db

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(300)]

ZONE = "inference.example."


def scope_of(reply: dns.message.Message) -> int:
    (option,) = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
    return int(option.scopelen)


async def test_clients_behind_a_resolver_reach_their_region_through_the_delegated_zone(
    tmp_path: Path,
) -> None:
    binary = unbound_binary()
    args = (
        "--processes", "--geoip-db", str(maxmind_test_db("GeoIP2-City-Test")),
        "--dns-ns", "ns1=127.0.0.1", "--dns-ns", "ns.provider.example.",
        "--dns-soa-rname", "ops@example.com", "--dns-soa-serial", "7",
        "--dns-soa-minimum", "10",
    )  # fmt: skip
    async with running_up(tmp_path, *args, regions=("eu-west", "us-west")) as up:
        port = free_port()
        conf = unbound_conf(tmp_path, port, up.dns_port, ZONE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GTM_")}
        with running([binary, "-d", "-c", str(conf)], env, "start of service"):
            resolver = Resolver(port)
            oxford = resolver.ask(f"api.{ZONE}", "A", ("2.2.3.0", 24))
            san_diego = resolver.ask(f"api.{ZONE}", "A", ("214.78.120.0", 24))
            ns = resolver.ask(ZONE, "NS")
            glue = resolver.ask(f"ns1.{ZONE}", "A")
            soa = resolver.ask(ZONE, "SOA")
            nowhere = resolver.ask(f"nowhere.{ZONE}", "A")

    assert [rd.to_text() for rd in oxford.answer[0]] == [up.address("eu-west")]
    assert scope_of(oxford) == 24
    assert [rd.to_text() for rd in san_diego.answer[0]] == [up.address("us-west")]
    assert scope_of(san_diego) == 22  # the database's network, wider than the /24 asked
    assert sorted(rd.to_text() for rd in ns.answer[0]) == [
        "ns.provider.example.",
        "ns1.inference.example.",
    ]
    assert [rd.to_text() for rd in glue.answer[0]] == ["127.0.0.1"]
    record = soa.answer[0][0]
    assert (record.mname.to_text(), record.rname.to_text()) == (
        "ns1.inference.example.",
        "ops.example.com.",
    )
    assert (record.serial, record.minimum) == (7, 10)
    assert nowhere.rcode() == dns.rcode.NXDOMAIN
    (authority,) = nowhere.authority
    assert authority.rdtype == dns.rdatatype.SOA
    assert 0 < authority.ttl <= 10

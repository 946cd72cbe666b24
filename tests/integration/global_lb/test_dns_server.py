"""The DNS server on loopback, queried with dnspython over UDP and TCP."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dns.asyncquery
import dns.edns
import dns.flags
import dns.message
import dns.rcode
import pytest

from global_lb.dns.responder import Responder
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.server import BoundAddress, DnsServer
from global_lb.dns.zone import ZoneConfig
from global_lb.geo import ChainLocator, MaxMindLocator
from global_lb.metrics import GlobalMetrics
from global_lb.router import GlobalRouter
from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.models import Endpoint
from tests.unit.global_lb.helpers import address_of, view, write_city_db

pytestmark = pytest.mark.integration


@pytest.fixture(params=[True, False], ids=["batched", "one-by-one"])
async def server(
    tmp_path: Path, dns_router: GlobalRouter, request: pytest.FixtureRequest
) -> AsyncIterator[BoundAddress]:
    """The server reading UDP in batches (recvmmsg) and one datagram at a time: every
    test runs against both loops."""
    from dataclasses import replace

    base = view()
    many = tuple(
        Endpoint(url=f"http://[fd00::{i:x}]:80", address=ipaddress.ip_address(f"fd00::{i:x}"))
        for i in range(1, 41)
    )
    regions = tuple(
        replace(r, endpoints=many) if r.id == "ap-southeast" else r for r in base.regions
    )
    current = replace(base, regions=regions)
    responder = Responder(
        ZoneConfig(max_addresses=64),
        view=lambda: current,
        router=dns_router,
        locator=ChainLocator(MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))),
        metrics=GlobalMetrics(new_registry()),
        clock=SystemClock(),
        rrl=RrlConfig(rate=0),
    )
    dns_server = DnsServer(responder, "127.0.0.1", 0, batched=request.param)
    address = await dns_server.start()
    assert dns_server.udp_batched is request.param
    yield address
    await dns_server.stop()


def make(
    name: str, rdtype: str = "A", subnet: tuple[str, int] | None = None, **kw: Any
) -> dns.message.Message:
    options: list[dns.edns.Option] = [dns.edns.ECSOption(*subnet)] if subnet else []
    return dns.message.make_query(
        name, rdtype, use_edns=0 if subnet else None, options=options, **kw
    )


def answers(reply: dns.message.Message) -> list[str]:
    return [r.to_text() for rrset in reply.answer for r in rrset]


@pytest.mark.parametrize("transport", ["udp", "tcp"])
@pytest.mark.parametrize(
    ("subnet", "rdtype", "expected", "scope"),
    [
        (("81.2.69.0", 24), "A", address_of("eu-west"), 24),
        (("2001:218::", 48), "AAAA", address_of("ap-northeast", 6), 32),
        (None, "A", None, None),
    ],
)
async def test_answers_over_udp_and_tcp(
    server: BoundAddress,
    transport: str,
    subnet: tuple[str, int] | None,
    rdtype: str,
    expected: str | None,
    scope: int | None,
) -> None:
    query = make("api.inference.example.", rdtype, subnet)
    send = dns.asyncquery.udp if transport == "udp" else dns.asyncquery.tcp
    reply = await send(query, server.host, port=server.port, timeout=5)
    assert reply.rcode() == dns.rcode.NOERROR
    if expected is not None:
        assert answers(reply) == [expected]
    else:  # loopback resolver, unknown location: some region, no ECS option
        assert len(answers(reply)) == 1
        assert reply.options == ()
    if scope is not None:
        (option,) = reply.options
        assert option.scopelen == scope


async def test_nodata_nxdomain_refused_formerr(server: BoundAddress) -> None:
    at: dict[str, Any] = {"where": server.host, "port": server.port, "timeout": 5}
    nodata = await dns.asyncquery.udp(
        make("us.api.inference.example.", subnet=("89.160.20.0", 24)), **at
    )
    assert (nodata.rcode(), nodata.answer, len(nodata.authority)) == (dns.rcode.NOERROR, [], 1)
    nx = await dns.asyncquery.udp(make("nope.inference.example."), **at)
    assert nx.rcode() == dns.rcode.NXDOMAIN
    refused = await dns.asyncquery.tcp(make("example.org."), **at)
    assert refused.rcode() == dns.rcode.REFUSED
    bad = make("api.inference.example.", subnet=("81.2.64.0", 20)).to_wire()
    bad = bad[:-1] + bytes([bad[-1] | 0x0F])  # set bits beyond the /20 source
    reply = await udp_raw(server, bad)
    assert dns.message.from_wire(reply).rcode() == dns.rcode.FORMERR


async def test_truncation_and_tcp_fallback(server: BoundAddress) -> None:
    query = make("ap-southeast.api.inference.example.", "AAAA", ("216.160.83.0", 24), payload=512)
    udp = await dns.asyncquery.udp(query, server.host, port=server.port, timeout=5)
    assert udp.flags & dns.flags.TC
    assert udp.answer == []
    tcp = await dns.asyncquery.tcp(query, server.host, port=server.port, timeout=5)
    assert len(tcp.answer[0]) == 40
    assert not tcp.flags & dns.flags.TC


async def test_tcp_pipelines_several_queries_on_one_connection(server: BoundAddress) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    queries = [
        make("api.inference.example.", subnet=(s, 24))
        for s in ("81.2.69.0", "216.160.83.0", "198.51.100.0")
    ]
    for q in queries:
        data = q.to_wire()
        writer.write(len(data).to_bytes(2) + data)
    await writer.drain()
    got = []
    for q in queries:
        length = int.from_bytes(await reader.readexactly(2))
        reply = dns.message.from_wire(await reader.readexactly(length))
        assert reply.id == q.id
        got.extend(answers(reply))
    writer.close()
    await writer.wait_closed()
    assert got == [address_of("eu-west"), address_of("us-west"), address_of("eu-central")]


async def udp_raw(server: BoundAddress, packet: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (server.host, server.port))
        await loop.sock_sendall(sock, packet)
        async with asyncio.timeout(5.0):
            return await loop.sock_recv(sock, 65535)
    finally:
        sock.close()


def mutations(rng: random.Random, seeds: list[bytes], count: int) -> list[bytes]:
    out = []
    for i in range(count):
        if i % 3 == 0:
            out.append(rng.randbytes(rng.randrange(0, 80)))
            continue
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(4)
            if op == 0 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif op == 1 and data:
                del data[rng.randrange(len(data)) :]
            elif op == 2:
                data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
            else:
                data[2:4] = rng.randbytes(2)
        out.append(bytes(data))
    return out


async def test_fuzzed_packets_never_break_the_server(server: BoundAddress) -> None:
    rng = random.Random(20260707)
    seeds = [
        make("api.inference.example.", subnet=("81.2.69.0", 24)).to_wire(),
        make("eu.api.inference.example.", "AAAA", ("2001:218::", 32)).to_wire(),
        make("inference.example.", "SOA").to_wire(),
    ]
    packets = mutations(rng, seeds, 3000)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (server.host, server.port))
    for index, packet in enumerate(packets):
        await loop.sock_sendall(sock, packet)
        if index % 100 == 0:
            await asyncio.sleep(0)  # let the server drain its socket
    sock.close()
    # Over TCP too: garbage lengths and bodies on a few connections.
    for packet in packets[:50]:
        _, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(len(packet).to_bytes(2) + packet + rng.randbytes(3))
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    # The server still answers valid queries correctly, on both transports.
    query = make("api.inference.example.", subnet=("81.2.69.0", 24))
    for send in (dns.asyncquery.udp, dns.asyncquery.tcp):
        reply = await send(query, server.host, port=server.port, timeout=5)
        assert answers(reply) == [address_of("eu-west")]

"""The DNS server's response rate limiting (with slip) and minimal ANY (RFC 8482),
checked from the outside with dnspython over real UDP and TCP on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import pytest

from global_lb import profiles
from global_lb.dns.responder import Responder
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.server import BoundAddress, DnsServer
from global_lb.dns.zone import ZoneConfig
from global_lb.geo import ChainLocator, MaxMindLocator
from global_lb.metrics import GlobalMetrics
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from tests.unit.global_lb.helpers import example_policy, view, write_city_db

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NAME = "api.inference.example."
BURST = 5
#: A dropped response is silence: wait this long before calling it dropped.
DROP_WAIT_S = 0.3


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BoundAddress]:
    """RRL at 5 responses/s per /24, burst 5, slip 2, on a clock that does not move
    unless told (so the bucket refills only when the test says so)."""
    spec = profiles.profile_spec(example_policy(), "global-dns", profiles.DEFAULT_DNS_PROFILE)
    router = GlobalRouter(profiles.build(global_registry(), spec, None), spec, cache_size=0)
    current = view()
    responder = Responder(
        ZoneConfig(),
        view=lambda: current,
        router=router,
        locator=ChainLocator(MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))),
        metrics=GlobalMetrics(new_registry()),
        clock=FakeClock(),
        rrl=RrlConfig(rate=5.0, burst=float(BURST), slip=2),
    )
    dns_server = DnsServer(responder, "127.0.0.1", 0)
    address = await dns_server.start()
    yield address
    await dns_server.stop()


async def _udp(server: BoundAddress, rdtype: str = "A") -> dns.message.Message | None:
    query = dns.message.make_query(NAME, rdtype)
    try:
        return await dns.asyncquery.udp(query, server.host, port=server.port, timeout=DROP_WAIT_S)
    except dns.exception.Timeout:
        return None


async def test_rrl_answers_the_burst_then_drops_and_slips_udp_only(
    server: BoundAddress,
) -> None:
    replies = [await _udp(server) for _ in range(BURST + 10)]
    answered = [r for r in replies[:BURST] if r is not None]
    assert len(answered) == BURST
    assert all(r.answer and not r.flags & dns.flags.TC for r in answered)
    over = replies[BURST:]
    # Slip 2: of the responses over the limit, every second one is sent truncated
    # (TC=1, no records: nothing to amplify), the others are dropped.
    slipped = [r for r in over if r is not None]
    assert len(slipped) == 5
    assert all(r.flags & dns.flags.TC and not r.answer for r in slipped)
    assert [r is None for r in over] == [True, False] * 5
    # TCP is never rate limited (it cannot be spoofed): the truncated client's retry works.
    for _ in range(BURST + 2):
        reply = await dns.asyncquery.tcp(
            dns.message.make_query(NAME, "A"), server.host, port=server.port, timeout=5
        )
        assert reply.rcode() == dns.rcode.NOERROR
        assert reply.answer


async def test_any_gets_one_synthesized_hinfo_over_udp_and_tcp(server: BoundAddress) -> None:
    udp = await _udp(server, "ANY")
    tcp = await dns.asyncquery.tcp(
        dns.message.make_query(NAME, "ANY"), server.host, port=server.port, timeout=5
    )
    for reply in (udp, tcp):
        assert reply is not None
        assert reply.rcode() == dns.rcode.NOERROR
        (rrset,) = reply.answer
        assert rrset.rdtype == dns.rdatatype.HINFO
        (record,) = list(rrset)
        assert record.cpu == b"RFC8482"
        assert record.os == b""
        assert len(reply.to_wire()) < 512  # minimal: no amplification through ANY


async def test_concurrent_floods_do_not_stop_tcp_service(server: BoundAddress) -> None:
    """Hundreds of UDP queries at once (most dropped by RRL) while TCP keeps answering."""

    async def flood() -> int:
        replies = await asyncio.gather(*(_udp(server) for _ in range(200)))
        return sum(1 for r in replies if r is not None and r.answer)

    async def tcp_client() -> int:
        ok = 0
        for _ in range(10):
            reply = await dns.asyncquery.tcp(
                dns.message.make_query(NAME, "A"), server.host, port=server.port, timeout=5
            )
            ok += bool(reply.answer)
        return ok

    answered, tcp_ok = await asyncio.gather(flood(), tcp_client())
    assert answered <= BURST  # the clock did not move: no refill
    assert tcp_ok == 10

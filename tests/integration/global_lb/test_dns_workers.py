"""``gtm global --dns-workers``: SO_REUSEPORT worker processes, supervised, on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import dns.edns
import dns.message
import pytest
import yaml

from global_lb.app import GlobalConfig, GlobalTier
from global_lb.audit import MemoryAudit
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.workers import DnsWorkers
from gtm.clock import SystemClock
from gtm.metrics import new_registry
from tests.unit.global_lb.helpers import address_of, topology, write_city_db

pytestmark = pytest.mark.integration

LONDON = ("81.2.69.0", 24)
RESPONSES = "gtm_global_dns_responses_total"


def _config(tmp_path: Path) -> GlobalConfig:
    topo = tmp_path / "topology.yaml"
    topo.write_text(
        yaml.safe_dump({"regions": [r.model_dump(mode="json", by_alias=True) for r in topology()]})
    )
    return GlobalConfig(
        dns_listen="127.0.0.1:0",
        http_listen=None,
        topology=str(topo),
        geoip_db=str(write_city_db(tmp_path / "city.mmdb")),
        rrl=RrlConfig(rate=0),
        dns_workers=2,
    )


@pytest.fixture
async def tier(tmp_path: Path) -> AsyncIterator[GlobalTier]:
    tier = GlobalTier(
        _config(tmp_path), clock=SystemClock(), registry=new_registry(), audit=MemoryAudit()
    )
    await tier.start()
    yield tier
    await tier.stop()


def _ask_from(port: int, sockets: int) -> list[str]:
    """One ECS query from each of ``sockets`` source ports (SO_REUSEPORT hashes on them)."""
    query = dns.message.make_query(
        "api.inference.example.", "A", use_edns=0, options=[dns.edns.ECSOption(*LONDON)]
    )
    found: list[str] = []
    for _ in range(sockets):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5.0)
            sock.sendto(query.to_wire(), ("127.0.0.1", port))
            reply = dns.message.from_wire(sock.recv(4096))
        found.extend(r.to_text() for rrset in reply.answer for r in rrset)
    return found


def _pool(tier: GlobalTier) -> DnsWorkers:
    assert tier.dns_pool is not None
    return tier.dns_pool


async def test_workers_share_the_port_and_their_answers_are_counted(tier: GlobalTier) -> None:
    assert tier.endpoints.dns is not None
    port = tier.endpoints.dns.port
    pool = _pool(tier)
    assert list(pool.pids) == [1]
    answers = await asyncio.to_thread(_ask_from, port, 64)
    assert answers == [address_of("eu-west")] * 64
    counter = tier.metrics.dns_responses.labels("api", "eu-west", "NOERROR")
    # Every answer is in the parent's /metrics once the child has reported; with 64
    # source ports both processes answered some (all on one: p = 2⁻⁶³).
    async with asyncio.timeout(30):
        await pool.wait_for(lambda: counter._value.get() == 64.0)
    assert 0 < pool.reported(1, RESPONSES) < 64


async def test_a_killed_worker_is_restarted_and_stop_ends_every_worker(tmp_path: Path) -> None:
    registry = new_registry()
    tier = GlobalTier(
        _config(tmp_path), clock=SystemClock(), registry=registry, audit=MemoryAudit()
    )
    await tier.start()
    try:
        pool = _pool(tier)
        assert registry.get_sample_value("gtm_global_dns_workers") == 1.0
        first = pool.pids[1]
        os.kill(first, signal.SIGKILL)
        async with asyncio.timeout(60):
            await pool.wait_for(lambda: pool.pids.get(1, first) != first)
        second = pool.pids[1]
        assert registry.get_sample_value("gtm_global_dns_worker_restarts_total") == 1.0
        assert tier.endpoints.dns is not None
        answers = await asyncio.to_thread(_ask_from, tier.endpoints.dns.port, 16)
        assert answers == [address_of("eu-west")] * 16
    finally:
        await tier.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)


def test_a_worker_exits_when_its_parent_goes_away(tmp_path: Path) -> None:
    """The parent holds the child's stdin: end of file (the parent died) stops it."""
    config = _config(tmp_path).model_copy(update={"dns_workers": 1, "reuse_port": True})
    child = subprocess.Popen(
        [sys.executable, "-m", "global_lb.dns.workers"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write(config.model_dump_json().encode() + b"\n")
    child.stdin.flush()
    ready = child.stdout.readline()
    assert ready.startswith(b'{"ready": "127.0.0.1:')
    child.stdin.close()
    assert child.wait(timeout=30) == 0
    child.stdout.close()

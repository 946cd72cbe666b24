"""Batched UDP (recvmmsg/sendmmsg) over real loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import select
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dns.edns
import dns.message
import pytest

from global_lb.dns import mmsg
from global_lb.dns.responder import Responder
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.server import DnsServer
from global_lb.dns.zone import ZoneConfig
from global_lb.geo import ChainLocator, IPAddress, MaxMindLocator
from global_lb.metrics import GlobalMetrics
from global_lb.router import GlobalRouter
from gtm.clock import SystemClock
from gtm.metrics import new_registry
from tests.unit.global_lb.helpers import view, write_city_db

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

Respond = Callable[[bytes, IPAddress], bytes | None]


def test_batched_io_is_available_on_linux() -> None:
    # CI runs Linux: the batched loop must be the one under test, not the fallback.
    assert mmsg.available()


class Served:
    """A BatchedUdp serving ``respond`` in a thread; oversized replies are recorded."""

    def __init__(self, family: socket.AddressFamily, host: str, respond: Respond) -> None:
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.address = self.sock.getsockname()[:2]
        self.batched = mmsg.BatchedUdp(self.sock, batch=8)
        self.fallbacks: list[tuple[bytes, IPAddress, int]] = []
        self.stopping = False
        self.thread = threading.Thread(
            target=self.batched.serve,
            args=(respond, lambda: self.stopping, self._fallback),
            daemon=True,
        )
        self.thread.start()

    def _fallback(self, reply: bytes, client: IPAddress, port: int) -> None:
        self.fallbacks.append((reply, client, port))
        self.sock.sendto(b"fallback", (str(client), port))

    def stop(self) -> None:
        self.stopping = True
        with contextlib.suppress(OSError):  # ENOTCONN, yet the blocked recvmmsg returns
            self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)
        self.sock.close()


def echo(packet: bytes, client: IPAddress) -> bytes | None:
    if packet.startswith(b"drop"):
        return None
    if packet.startswith(b"big"):
        return b"x" * (mmsg.SLOT_SIZE + 1)
    return packet + b"|" + str(client).encode()


@pytest.fixture(params=[(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")], ids=["v4", "v6"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    family, host = request.param
    server = Served(family, host, echo)
    yield server
    server.stop()
    assert not server.thread.is_alive()


def clients(server: Served, count: int) -> list[socket.socket]:
    out = []
    for _ in range(count):
        sock = socket.socket(server.sock.family, socket.SOCK_DGRAM)
        sock.settimeout(5.0)
        sock.bind((server.address[0], 0))
        out.append(sock)
    return out


def test_every_datagram_is_answered_to_its_own_sender(served: Served) -> None:
    socks = clients(served, 3)
    host = served.address[0]
    # More than a batch (8) in flight from several senders at once.
    for round_ in range(4):
        for i, sock in enumerate(socks):
            for j in range(4):
                sock.sendto(f"q{round_}.{i}.{j}".encode(), served.address)
        for i, sock in enumerate(socks):
            got = sorted(sock.recvfrom(100)[0] for _ in range(4))
            assert got == sorted(f"q{round_}.{i}.{j}|{host}".encode() for j in range(4))
    for sock in socks:
        sock.close()


def test_no_reply_skips_one_datagram_and_the_batch_goes_on(served: Served) -> None:
    (sock,) = clients(served, 1)
    for text in (b"a", b"drop", b"b", b"drop", b"c"):
        sock.sendto(text, served.address)
    host = served.address[0].encode()
    assert sorted(sock.recvfrom(100)[0] for _ in range(3)) == [
        b"a|" + host,
        b"b|" + host,
        b"c|" + host,
    ]
    sock.sendto(b"d", served.address)  # nothing else was sent in between
    assert sock.recvfrom(100)[0] == b"d|" + host
    sock.close()


def test_a_reply_longer_than_a_slot_goes_through_the_fallback(served: Served) -> None:
    (sock,) = clients(served, 1)
    sock.sendto(b"big", served.address)
    assert sock.recvfrom(100)[0] == b"fallback"
    ((reply, client, port),) = served.fallbacks
    assert len(reply) == mmsg.SLOT_SIZE + 1
    assert str(client) == served.address[0]
    assert port == sock.getsockname()[1]
    sock.close()


@dataclass(frozen=True)
class Cached:
    """A cached answer as the batched loop reads it (``mmsg.CachedAnswer``)."""

    tail: bytes
    slot: int
    per_client: bool
    address: int
    size: int

    @classmethod
    def of(cls, tail: bytes, slot: int, per_client: bool = False) -> Cached:
        return cls(tail, slot, per_client, mmsg.buffer_address(tail), len(tail))


@pytest.mark.parametrize("family_host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_one_batch_mixing_cached_computed_and_dropped_answers(
    family_host: tuple[socket.AddressFamily, str],
) -> None:
    """Every datagram is queued before the loop's first read, so one recvmmsg takes them
    all: cached answers (sent from the cache's own bytes after the query's ID), answers
    computed by ``respond``, a per-client entry (computed too), datagrams with no answer
    and an empty one, in one sendmmsg, each to its sender with its own ID."""
    family, host = family_host
    server = socket.socket(family, socket.SOCK_DGRAM)
    server.bind((host, 0))
    batched = mmsg.BatchedUdp(server, batch=16)
    table = {
        b"hit-a": Cached.of(b"-answer-a", 0),
        b"hit-b": Cached.of(b"-answer-b" * 20, 1),
        b"mine": Cached.of(b"", 2, per_client=True),
    }
    counts = [0, 0, 0]
    socks = [socket.socket(family, socket.SOCK_DGRAM) for _ in range(2)]
    for sock in socks:
        sock.bind((host, 0))
    sent: list[tuple[int, bytes]] = [
        (0, b"\x00\x01hit-a"),
        (1, b"\x00\x02drop"),
        (0, b"\x00\x03slow"),
        (1, b"\x00\x04hit-b"),
        (0, b""),
        (1, b"\x00\x05mine"),
        (0, b"\x00\x06hit-a"),
        (1, b"\x00\x07hit-a"),
    ]
    for index, payload in sent:
        socks[index].sendto(payload, server.getsockname())

    def respond(packet: bytes, client: IPAddress) -> bytes | None:
        return None if packet.endswith(b"drop") else packet + b"|" + str(client).encode()

    stopping = False
    thread = threading.Thread(
        target=batched.serve,
        args=(respond, lambda: stopping, lambda *_: None, lambda: (table, counts)),
        daemon=True,
    )
    thread.start()
    try:
        expected: list[set[bytes]] = [set(), set()]
        for index, payload in sent:
            if not payload or payload.endswith(b"drop"):
                continue
            host_of = host.encode()
            cached = table.get(payload[2:])
            if cached is not None and not cached.per_client:
                expected[index].add(payload[:2] + cached.tail)
            else:
                expected[index].add(payload + b"|" + host_of)
        for index, sock in enumerate(socks):
            sock.settimeout(5.0)
            got = {sock.recv(4096) for _ in expected[index]}
            assert got == expected[index]
        assert counts == [3, 1, 0]  # hits counted by slot; the per-client entry is not one
    finally:
        stopping = True
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        thread.join(timeout=10)
        server.close()
        for sock in socks:
            sock.close()
    assert not thread.is_alive()


def test_receive_takes_every_waiting_datagram() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    batched = mmsg.BatchedUdp(server, batch=4)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(6):
        sender.sendto(bytes([i]), server.getsockname())
    total = 0
    while total < 6:
        assert select.select([server], [], [], 5.0)[0], "datagrams went missing"
        count = batched.receive()
        assert 1 <= count <= 4  # never more than the batch
        total += count
    assert total == 6
    sender.close()
    server.close()


def test_a_socket_of_another_family_is_refused() -> None:
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock,
        pytest.raises(OSError, match="not an IP socket"),
    ):
        mmsg.BatchedUdp(sock)


async def test_cached_answers_copied_by_the_batch_loop_are_exact_and_counted(
    tmp_path: Path, dns_router: GlobalRouter
) -> None:
    """The batched loop answers cache hits itself (Responder.udp_table): each reply
    must be the one respond() gives, with the query's own ID, and be counted."""
    registry = new_registry()
    responder = Responder(
        ZoneConfig(),
        view=lambda: current,
        router=dns_router,
        locator=ChainLocator(MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))),
        metrics=GlobalMetrics(registry),
        clock=SystemClock(),
        rrl=RrlConfig(rate=0),
    )
    current = view()
    server = DnsServer(responder, "127.0.0.1", 0, batched=True)
    address = await server.start()
    try:
        assert server.udp_batched
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (address.host, address.port))
        query = dns.message.make_query(
            "api.inference.example.", "A", use_edns=0, options=[dns.edns.ECSOption("81.2.69.0", 24)]
        )
        expected_tail = None
        for round_ in range(5):
            ids = [(round_ * 64 + k) % 65536 for k in range(40)]
            for ident in ids:  # a burst: the server reads several per batch
                query.id = ident
                await loop.sock_sendall(sock, query.to_wire())
            got = {}
            for _ in ids:
                async with asyncio.timeout(5):
                    raw = await loop.sock_recv(sock, 4096)
                got[int.from_bytes(raw[:2])] = raw
            assert sorted(got) == sorted(ids)
            tails = {raw[2:] for raw in got.values()}
            assert len(tails) == 1  # the same response, each with its query's ID
            if expected_tail is None:
                query.id = 7
                reference = responder.respond(query.to_wire(), ipaddress.ip_address("127.0.0.1"))
                assert reference is not None
                expected_tail = reference[2:]
            assert tails == {expected_tail}
        sock.close()
        responder.flush_counts()
        labels = {"kind": "api", "region": "eu-west", "rcode": "NOERROR"}
        answered = registry.get_sample_value("gtm_global_dns_responses_total", labels)
        assert answered == 5 * 40 + 1  # every UDP answer and the reference query
    finally:
        await server.stop()


def test_a_read_of_a_few_datagrams_pauses_before_the_next() -> None:
    """Coalescing (mmsg module docstring): a read of 2..below-1 datagrams is followed by
    one pause; a read of one, or of at least ``below``, is not. Every read here finds
    what was queued before it (loopback delivers in ``sendto``), so the reads are 3, 5
    and 1 datagrams whatever the scheduling."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.settimeout(5.0)
    sender.bind(("127.0.0.1", 0))
    address = server.getsockname()
    pauses: list[float] = []
    stopping = threading.Event()

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        for i in range(5):  # the next read: five, not followed by a pause
            sender.sendto(b"b%d" % i, address)

    def respond(packet: bytes, client: IPAddress) -> bytes | None:
        if packet == b"b4":
            sender.sendto(b"cc", address)  # the read after: one, not followed by a pause
        if packet == b"cc":
            stopping.set()
        return packet

    batched = mmsg.BatchedUdp(server, batch=8, coalesce_below=4, coalesce_s=0.25, sleep=pause)
    for i in range(3):  # the first read: three, followed by one pause
        sender.sendto(b"a%d" % i, address)
    thread = threading.Thread(
        target=batched.serve, args=(respond, stopping.is_set, lambda *_: None), daemon=True
    )
    thread.start()
    answers = sorted(sender.recvfrom(64)[0] for _ in range(9))
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert answers == sorted([b"a0", b"a1", b"a2", b"b0", b"b1", b"b2", b"b3", b"b4", b"cc"])
    assert pauses == [0.25]
    sender.close()
    server.close()

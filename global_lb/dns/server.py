"""UDP and TCP listeners around the :class:`~global_lb.dns.responder.Responder`.

UDP is read by a thread of its own (a blocking socket loop, :class:`_UdpThread`), TCP
by asyncio streams.

UDP: one datagram in, at most one out; a response that does not fit the client's UDP
size is sent truncated and the client retries over TCP (RFC 7766). TCP: two-byte length
prefixed messages, several per connection (pipelining, RFC 7766 §6.2.1), answered in
order; a connection idle for ``tcp_idle_timeout`` seconds is closed (RFC 7766 §6.2.3
recommends seconds, not minutes, for a busy server). Nothing a client sends can stop
either listener: every packet goes through ``Responder.respond``, which never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import threading
from dataclasses import dataclass

from global_lb.dns import mmsg
from global_lb.dns.responder import Responder
from global_lb.geo import IPAddress
from gtm.errors import ConfigError

log = logging.getLogger(__name__)

#: Idle TCP connections are closed after this long (RFC 7766 §6.2.3: "on the order of
#: seconds").
TCP_IDLE_TIMEOUT = 10.0
#: Concurrent TCP connections; more are accepted and closed at once.
MAX_TCP_CONNECTIONS = 1024


def parse_listen(text: str, default_port: int) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``HOST`` → (host, port)."""
    host, port = text, default_port
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError(f"{text!r}: unclosed '[' in a listen address")
        host = text[1:end]
        rest = text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"{text!r}: expected ':PORT' after ']'")
            port = _port(text, rest[1:])
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _port(text, port_text)
    if not host:
        raise ConfigError(f"{text!r}: missing host")
    return host, port


def _port(text: str, value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise ConfigError(f"{text!r}: port must be 0..65535")
    return int(value)


class _UdpThread:
    """Answers datagrams in a thread of its own, with a blocking socket loop.

    On Linux the loop reads and writes batches (``recvmmsg``/``sendmmsg``,
    :mod:`global_lb.dns.mmsg`): under load two system calls per batch instead of two
    per query. Elsewhere, or with ``batched=False``, one datagram at a time:

    Under load an asyncio reader costs more than the answer: ``loop.add_reader`` wakes the
    loop, polls and dispatches per batch, and a non-blocking read needs a failed
    ``recvfrom`` to find the socket empty. A blocking ``recvfrom`` → ``respond`` →
    ``sendto`` loop is two system calls a query and nothing else, and answers more
    queries a second than the reader (``bench/geodns_throughput.py``). The thread
    releases the GIL in both calls, so the event loop (TCP, health checks, store
    watches) keeps running. ``stop()`` shuts the socket down, which wakes a blocked
    ``recvfrom`` (Linux returns an empty datagram). A reply the socket cannot take is
    dropped: the client retries, as after any UDP loss.
    """

    def __init__(self, sock: socket.socket, responder: Responder, *, batched: bool = True) -> None:
        self._sock = sock
        self._responder = responder
        self._stopping = False
        self._batch = mmsg.BatchedUdp(sock) if batched and mmsg.available() else None
        run = self._run if self._batch is None else self._run_batched
        self._thread = threading.Thread(target=run, name="dns-udp", daemon=True)

    @property
    def batched(self) -> bool:
        return self._batch is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):  # ENOTCONN, yet the blocked reader wakes up
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=5.0)
        self._sock.close()

    def _run_batched(self) -> None:
        assert self._batch is not None

        def send_one(reply: bytes, client: IPAddress, port: int) -> None:
            with contextlib.suppress(OSError):
                self._sock.sendto(reply, (str(client), port))

        responder = self._responder
        self._batch.serve(
            responder.respond_udp, lambda: self._stopping, send_one, responder.udp_table
        )

    def _run(self) -> None:
        sock, respond = self._sock, self._responder.respond_udp
        recv, send = sock.recvfrom, sock.sendto
        # Peer address string → parsed address: parsing costs more than answering a
        # repeated query; resolvers are few.
        peers: dict[str, IPAddress] = {}
        while not self._stopping:
            try:
                data, addr = recv(RECEIVE_SIZE)
            except OSError:  # e.g. ICMP port unreachable reported on the next read
                continue
            if not addr:  # the wake-up of stop()
                continue
            host = addr[0]
            client = peers.get(host)
            if client is None:
                try:
                    client = ipaddress.ip_address(host.partition("%")[0])
                except ValueError:
                    continue
                if len(peers) >= 65_536:
                    peers.clear()
                peers[host] = client
            reply = respond(data, client)
            if reply is not None:
                # Not contextlib.suppress: a context manager per query costs more than
                # this try.
                try:  # noqa: SIM105
                    send(reply, addr)
                except OSError:
                    pass


#: Bytes read per datagram. A UDP query is far smaller (we advertise 1,232 bytes,
#: MAX_UDP_PAYLOAD); a longer one arrives cut short and gets FORMERR. Reading 64 KiB
#: would allocate 64 KiB per query.
RECEIVE_SIZE = 4096


def _udp_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with contextlib.suppress(OSError):  # a bigger buffer rides out bursts
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(address)
        sock.setblocking(True)  # read by a thread of its own (_UdpThread)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(frozen=True, slots=True)
class BoundAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class DnsServer:
    """UDP and TCP on the same address and port. ``start()`` binds; ``stop()`` closes.

    ``batched=False`` reads UDP one datagram at a time even where ``recvmmsg`` exists.
    """

    def __init__(
        self,
        responder: Responder,
        host: str = "127.0.0.1",
        port: int = 5353,
        *,
        tcp_idle_timeout: float = TCP_IDLE_TIMEOUT,
        reuse_port: bool = False,
        batched: bool = True,
    ) -> None:
        self._responder = responder
        self._batched = batched
        self._host = host
        self._port = port
        self._idle = tcp_idle_timeout
        self._reuse_port = reuse_port
        self._udp: _UdpThread | None = None
        self._tcp: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.address: BoundAddress | None = None

    async def start(self) -> BoundAddress:
        """Bind UDP (an ephemeral port when ``port`` is 0), then TCP on the same port.

        With port 0 the kernel picks a free UDP port, which may be taken for TCP: then
        both are closed and another is tried (a few times).
        """
        attempts = 20 if self._port == 0 else 1
        for attempt in range(attempts):
            try:
                return await self._bind()
            except ConfigError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    async def _bind(self) -> BoundAddress:
        try:
            sock = _udp_socket(self._host, self._port, self._reuse_port)
            self._udp = _UdpThread(sock, self._responder, batched=self._batched)
            bound = sock.getsockname()
            self._tcp = await asyncio.start_server(
                self._serve_tcp,
                self._host,
                bound[1],
                reuse_address=True,
                reuse_port=self._reuse_port or None,
            )
        except OSError as exc:
            await self.stop()
            raise ConfigError(
                f"cannot listen for DNS on {self._host}:{self._port}: {exc.strerror}"
            ) from None
        self._udp.start()
        self.address = BoundAddress(str(bound[0]), int(bound[1]))
        return self.address

    @property
    def udp_batched(self) -> bool:
        """Whether UDP is read and written in batches (``recvmmsg``/``sendmmsg``)."""
        return self._udp is not None and self._udp.batched

    async def stop(self) -> None:
        if self._udp is not None:
            await asyncio.to_thread(self._udp.stop)
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            for writer in list(self._connections):
                writer.close()
            await self._tcp.wait_closed()
            self._tcp = None

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= MAX_TCP_CONNECTIONS:
            writer.close()
            return
        self._connections.add(writer)
        peer = writer.get_extra_info("peername")
        try:
            client = ipaddress.ip_address(str(peer[0]).partition("%")[0])
            while True:
                async with asyncio.timeout(self._idle):
                    length = int.from_bytes(await reader.readexactly(2))
                    packet = await reader.readexactly(length)
                reply = self._responder.respond(packet, client, udp=False)
                if reply is None:
                    break  # a packet we do not answer ends the connection
                writer.write(len(reply).to_bytes(2) + reply)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

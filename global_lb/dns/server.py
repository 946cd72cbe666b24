"""asyncio UDP and TCP listeners around the :class:`~global_lb.dns.responder.Responder`.

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
from dataclasses import dataclass

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


class _UdpReader:
    """Answers datagrams straight off a non-blocking socket, in batches.

    ``loop.add_reader`` calls :meth:`readable` once the socket has data; it then reads
    until the socket is empty (at most :data:`UDP_BATCH` datagrams, to stay fair to the
    rest of the loop). Under load that is one poll for many packets, where asyncio's
    datagram transport polls and dispatches once per packet — about half the cost of a
    repeated query. A reply that the socket cannot take right now is dropped: the client
    retries, as it would after any UDP loss.
    """

    def __init__(self, sock: socket.socket, responder: Responder) -> None:
        self._sock = sock
        self._responder = responder
        # Peer address string → parsed address: parsing costs more than answering a
        # repeated query; resolvers are few.
        self._peers: dict[str, IPAddress] = {}

    def readable(self) -> None:
        sock, respond, peers = self._sock, self._responder.respond, self._peers
        for _ in range(UDP_BATCH):
            try:
                data, addr = sock.recvfrom(65_535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. ICMP port unreachable reported on the next read
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
            reply = respond(data, client, udp=True)
            if reply is not None:
                with contextlib.suppress(OSError):
                    sock.sendto(reply, addr)


#: Datagrams answered per wake-up before yielding to the event loop.
UDP_BATCH = 64


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
        sock.setblocking(False)
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
    """UDP and TCP on the same address and port. ``start()`` binds; ``stop()`` closes."""

    def __init__(
        self,
        responder: Responder,
        host: str = "127.0.0.1",
        port: int = 5353,
        *,
        tcp_idle_timeout: float = TCP_IDLE_TIMEOUT,
        reuse_port: bool = False,
    ) -> None:
        self._responder = responder
        self._host = host
        self._port = port
        self._idle = tcp_idle_timeout
        self._reuse_port = reuse_port
        self._udp: socket.socket | None = None
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
        loop = asyncio.get_running_loop()
        try:
            sock = _udp_socket(self._host, self._port, self._reuse_port)
            self._udp = sock
            loop.add_reader(sock.fileno(), _UdpReader(sock, self._responder).readable)
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
        self.address = BoundAddress(str(bound[0]), int(bound[1]))
        return self.address

    async def stop(self) -> None:
        if self._udp is not None:
            asyncio.get_running_loop().remove_reader(self._udp.fileno())
            self._udp.close()
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

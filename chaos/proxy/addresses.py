"""``host:port`` handling with Go's ``net`` semantics and error wording.

Toxiproxy stores a proxy's ``listen`` as the *bound* address once started
(``127.0.0.1:0`` becomes ``127.0.0.1:41234``, ``localhost:x`` becomes ``127.0.0.1:x``),
compares addresses after ``net.ResolveTCPAddr`` (so ``localhost:7070`` equals
``127.0.0.1:7070``), and reports failures raw as 500s, e.g.
``listen tcp 127.0.0.1:3310: bind: address already in use``. An empty host means every
interface (one dual-stack socket, shown as ``[::]:port``), like Go's ``net.Listen``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from dataclasses import dataclass

from chaos.proxy.errors import AddressError


@dataclass(frozen=True, slots=True)
class TcpAddress:
    """A resolved TCP address; ``ip`` is None for "every interface"."""

    ip: str | None
    port: int

    def __str__(self) -> str:
        """Go's ``TCPAddr.String()``: ``1.2.3.4:80``, ``[::1]:80``, ``:80``."""
        return join_host_port(self.ip or "", self.port)


def join_host_port(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``: ``("", "80")`` for ``:80``, brackets for IPv6."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise AddressError(f"address {address}: missing ']' in address")
        host, rest = address[1:end], address[end + 1 :]
        if not rest.startswith(":"):
            raise AddressError(f"address {address}: missing port in address")
        return host, rest[1:]
    if ":" not in address:
        raise AddressError(f"address {address}: missing port in address")
    host, _, port = address.rpartition(":")
    if ":" in host:
        raise AddressError(f"address {address}: too many colons in address")
    return host, port


def parse_port(address: str, port: str) -> int:
    if port.isdigit():
        number = int(port)
        if number <= 65535:
            return number
        raise AddressError(f"address {address}: invalid port")
    try:
        return socket.getservbyname(port, "tcp")
    except OSError:
        raise AddressError(f"lookup tcp/{port}: unknown port") from None


async def resolve(address: str) -> TcpAddress:
    """``net.ResolveTCPAddr("tcp", address)``: IPv4 preferred, like Go's "tcp" network.

    An empty address is every interface on an ephemeral port (Go skips parsing it).
    """
    if not address:
        return TcpAddress(None, 0)
    host, port_text = split_host_port(address)
    port = parse_port(address, port_text)
    if not host:
        return TcpAddress(None, port)
    try:
        return TcpAddress(str(ipaddress.ip_address(host)), port)
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise AddressError(f"lookup {host}: no such host") from None
    ips = [str(info[4][0]) for info in infos]
    ipv4 = [ip for ip in ips if ":" not in ip]
    if not ips:
        raise AddressError(f"lookup {host}: no such host")
    return TcpAddress((ipv4 or ips)[0], port)


async def resolved_string(address: str) -> str:
    """The address as Toxiproxy compares it (``localhost:7070`` → ``127.0.0.1:7070``)."""
    return str(await resolve(address))


def _go_errno_text(exc: OSError) -> str:
    """Go prints syscall errors lower-case: ``address already in use``."""
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return text[:1].lower() + text[1:]


async def bind_listener(address: str) -> socket.socket:
    """A listening, non-blocking socket for ``address`` (``net.Listen("tcp", …)``)."""
    try:
        target = await resolve(address)
    except AddressError as exc:
        raise AddressError(f"listen tcp: {exc.message}") from None
    if target.ip is None:
        return _bind_any(target.port)
    family = socket.AF_INET6 if ":" in target.ip else socket.AF_INET
    return _bind(family, target.ip, target.port, str(target))


def _bind_any(port: int) -> socket.socket:
    try:
        return _bind(socket.AF_INET6, "::", port, f":{port}", dual_stack=True)
    except AddressError:
        if socket.has_ipv6:
            raise
        return _bind(socket.AF_INET, "0.0.0.0", port, f":{port}")


def _bind(
    family: socket.AddressFamily, ip: str, port: int, shown: str, *, dual_stack: bool = False
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Go sets SO_REUSEADDR on listeners, so a proxy can re-bind its port at once
        # after being disabled even with connections in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((ip, port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise AddressError(f"listen tcp {shown}: bind: {_go_errno_text(exc)}") from None
    return sock


def bound_address(sock: socket.socket) -> str:
    """The bound address in Go's form: ``127.0.0.1:41234``, ``[::]:41234``."""
    name = sock.getsockname()
    return join_host_port(str(name[0]), int(name[1]))


def upstream_target(upstream: str) -> tuple[str, int]:
    """``(host, port)`` to dial for ``upstream``; raises AddressError if malformed."""
    host, port = split_host_port(upstream)
    return host or "localhost", parse_port(upstream, port)

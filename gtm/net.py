"""Listener addresses: ``HOST:PORT`` read one way, and ports picked before they are bound.

Every command that listens (``gtm zone``, ``gtm regional``, ``gtm up``) reads its
``--listen``-style options with :func:`split_host_port`.

``gtm up`` and the chaos runner choose a listener's port, hand it to a child process on
its command line, and the child binds it a moment later. The port must still be free
then, so it is taken from a range nobody else binds by accident (see ``PICK_RANGE``).
"""

from __future__ import annotations

import ipaddress
import random
import re
import socket
from collections.abc import Collection

from gtm.errors import ConfigError

#: Ports chosen ahead of binding come from below Linux's default ephemeral range
#: (32768–60999, ``net.ipv4.ip_local_port_range``) and below the zone ports tests and
#: chaos runs place at 20000–30000: a port picked now and bound a moment later must not
#: be taken meanwhile by a child binding port 0 (this once failed a CI run).
PICK_RANGE = (10_000, 20_000)

#: RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens. Use
#: with ``fullmatch`` ("$" would also match before a trailing newline).
HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


def is_host(text: str) -> bool:
    """Whether ``text`` is an IP address or a syntactically valid host name."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return HOSTNAME.fullmatch(text) is not None
    return True


def split_host_port(value: str, *, example: str = "127.0.0.1:8080") -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) as ``(host, port)``.

    Raises:
        ConfigError: no port, an empty host, or a port that is not 0..65535 (the message
            quotes ``value`` and shows ``example``).
    """
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{value!r} is not HOST:PORT (e.g. {example})")
    return host, int(port)


def free_port(host: str, *, avoid: Collection[int] = ()) -> int:
    """A port free for both TCP and UDP on ``host`` now (a DNS server needs both), none
    of ``avoid``: ports chosen already and not bound yet, which would look free again
    (two picks in a row were once the same port, and a CI run's DNS server and HTTP
    listener then fought over it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(*PICK_RANGE)
        if port not in avoid and bindable(family, host, port):
            return port
    raise ConfigError(f"no free port on {host} in {PICK_RANGE[0]}-{PICK_RANGE[1] - 1}")


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports, each as :func:`free_port` picks one."""
    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port(host, avoid=ports))
    return ports


def bindable(family: socket.AddressFamily, host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` can be bound now for both TCP and UDP."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(family, kind) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True

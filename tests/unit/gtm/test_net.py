"""``split_host_port`` reads every listener option one way; ``free_port`` picks below the
ephemeral range, so a child binding port 0 cannot take a port chosen for a listener that
binds a moment later."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from gtm import net
from gtm.errors import ConfigError
from gtm.net import PICK_RANGE, bindable, free_port, split_host_port


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8100", ("127.0.0.1", 8100)),
        (" localhost:0 ", ("localhost", 0)),
        ("[::1]:65535", ("::1", 65535)),
    ],
)
def test_host_port_is_split(value: str, expected: tuple[str, int]) -> None:
    assert split_host_port(value) == expected


@pytest.mark.parametrize("value", ["nope", ":8100", "[]:80", "host:", "host:-1", "host:65536"])
def test_a_malformed_host_port_names_itself_and_the_example(value: str) -> None:
    with pytest.raises(ConfigError, match=r"is not HOST:PORT \(e\.g\. 127\.0\.0\.1:8100\)"):
        split_host_port(value, example="127.0.0.1:8100")


def test_free_ports_are_below_the_ephemeral_range_and_bindable_for_tcp_and_udp() -> None:
    low, high = PICK_RANGE
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert high <= ephemeral_low
    for _ in range(20):
        port = free_port("127.0.0.1")
        assert low <= port < high
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as sock:
                sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_bindable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        assert not bindable(socket.AF_INET, "127.0.0.1", taken)


def test_ports_picked_together_are_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two picks in a row may draw the same port (free both times: nothing bound it
    yet); ports picked together never are (a DNS server and an HTTP listener once
    fought over one)."""
    draws = iter([12_345, 12_345, 12_345, 12_346])
    monkeypatch.setattr(random.SystemRandom, "randrange", lambda self, a, b: next(draws))
    monkeypatch.setattr(net, "bindable", lambda family, host, port: True)
    assert net.free_ports("127.0.0.1", 2) == [12_345, 12_346]


def test_free_ports_are_distinct_and_free() -> None:
    ports = net.free_ports("127.0.0.1", 20)
    assert len(set(ports)) == 20
    assert all(net.PICK_RANGE[0] <= p < net.PICK_RANGE[1] for p in ports)

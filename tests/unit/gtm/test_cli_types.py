"""The shared command-line value types: what each accepts, returns and refuses."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import click
import pytest

from gtm.cli_types import HostPort, HttpURL, IPNetwork, NewFile, StateURL


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        (" localhost:53 ", "localhost:53"),
        ("[::1]:5353", "[::1]:5353"),
        ("0.0.0.0:0", "0.0.0.0:0"),
    ],
)
def test_host_port_accepts_and_canonicalises(value: str, expected: str) -> None:
    assert HostPort().convert(value, None, None) == expected


@pytest.mark.parametrize(
    "value", ["nonsense", "127.0.0.1", "127.0.0.1:99999", "bad host:80", ":80", "a:b"]
)
def test_host_port_refuses(value: str) -> None:
    with pytest.raises(click.BadParameter, match=re.escape("e.g. 127.0.0.1:8080")):
        HostPort().convert(value, None, None)


def test_host_port_off_and_ip_only() -> None:
    assert HostPort(off=True).convert("off", None, None) == "off"
    with pytest.raises(click.BadParameter, match="or off"):
        HostPort(off=True).convert("nonsense", None, None)
    with pytest.raises(click.BadParameter, match="not an IP address"):
        HostPort(ip_only=True).convert("localhost:80", None, None)


def test_state_url_is_canonical_or_refused() -> None:
    assert StateURL().convert("memory://", None, None) == "memory"
    assert StateURL().convert("etcd://LocalHost", None, None) == "etcd://localhost:2379"
    with pytest.raises(click.BadParameter, match="invalid state store 'foo://'"):
        StateURL().convert("foo://", None, None)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("nonsense", "scheme"),
        ("ftp://x", "scheme"),
        ("http://", "no valid host"),
        ("http://127.0.0.1:99999", "port"),
        ("http://bad host", "white space"),
    ],
)
def test_http_url_refuses(value: str, why: str) -> None:
    with pytest.raises(click.BadParameter, match=why):
        HttpURL().convert(value, None, None)


def test_http_url_drops_the_trailing_slash() -> None:
    assert HttpURL().convert("https://[::1]:8443/", None, None) == "https://[::1]:8443"


def test_ip_network_allows_host_bits() -> None:
    assert IPNetwork().convert("10.1.2.3/8", None, None) == ipaddress.ip_network("10.0.0.0/8")
    with pytest.raises(click.BadParameter, match="not a network"):
        IPNetwork().convert("10.0.0.0/33", None, None)


def test_new_file_needs_its_directory(tmp_path: Path) -> None:
    assert NewFile().convert(str(tmp_path / "out.json"), None, None) == str(tmp_path / "out.json")
    with pytest.raises(click.BadParameter, match="no such directory"):
        NewFile().convert(str(tmp_path / "missing" / "out.json"), None, None)
    with pytest.raises(click.BadParameter, match="is a directory"):
        NewFile().convert(str(tmp_path), None, None)

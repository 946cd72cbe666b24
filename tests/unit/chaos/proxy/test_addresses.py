import pytest

from chaos.proxy.addresses import (
    TcpAddress,
    join_host_port,
    resolve,
    split_host_port,
    upstream_target,
)
from chaos.proxy.errors import AddressError


@pytest.mark.parametrize(
    ("address", "parts"),
    [
        ("127.0.0.1:80", ("127.0.0.1", "80")),
        (":0", ("", "0")),
        ("[::1]:443", ("::1", "443")),
        ("localhost:http", ("localhost", "http")),
    ],
)
def test_split_host_port(address: str, parts: tuple[str, str]) -> None:
    assert split_host_port(address) == parts


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("local373", "address local373: missing port in address"),
        ("::1:80", "address ::1:80: too many colons in address"),
        ("[::1", "address \\[::1: missing ']' in address"),
        ("[::1]80", "address \\[::1\\]80: missing port in address"),
    ],
)
def test_split_errors_use_go_words(address: str, message: str) -> None:
    with pytest.raises(AddressError, match=message) as caught:
        split_host_port(address)
    assert caught.value.status == 500


async def test_resolve_keeps_ips_and_empty_host() -> None:
    assert str(await resolve("127.0.0.1:7070")) == "127.0.0.1:7070"
    assert str(await resolve("[0:0::1]:7070")) == "[::1]:7070"
    assert str(await resolve(":0")) == ":0"
    assert str(await resolve("")) == ":0"  # Go: every interface, ephemeral port


async def test_resolve_localhost_to_ipv4() -> None:
    assert await resolve("localhost:7070") == TcpAddress("127.0.0.1", 7070)


async def test_invalid_ports() -> None:
    with pytest.raises(AddressError, match="invalid port"):
        await resolve("127.0.0.1:99999")
    with pytest.raises(AddressError, match="unknown port"):
        await resolve("127.0.0.1:no-such-service")


def test_join_brackets_ipv6() -> None:
    assert join_host_port("::", 80) == "[::]:80"
    assert join_host_port("10.0.0.1", 80) == "10.0.0.1:80"


def test_upstream_target() -> None:
    assert upstream_target("db.internal:5432") == ("db.internal", 5432)
    assert upstream_target(":5432") == ("localhost", 5432)
    with pytest.raises(AddressError):
        upstream_target("no-port")

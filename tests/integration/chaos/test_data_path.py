"""Bytes through real sockets on loopback, with every toxic, in real (bounded) time.

Timing assertions have a floor (the toxic must cost at least what it promises) and a
generous ceiling (2 shared cores): e.g. 100 ms of latency adds >= 100 ms and < 300 ms.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from tests.integration.chaos.conftest import (
    Api,
    Upstream,
    connect,
    is_up,
    read_exactly,
    read_to_eof,
)

pytestmark = pytest.mark.integration


async def round_trip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes = b"ping"
) -> float:
    start = time.perf_counter()
    writer.write(payload)
    assert await read_exactly(reader, len(payload)) == payload
    return time.perf_counter() - start


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


async def test_echo_through_the_proxy(api: Api, echo: Upstream) -> None:
    proxy = await api.create("echo", echo.address)
    reader, writer = await connect(proxy["listen"])
    payload = bytes(range(256)) * 1024
    writer.write(payload)
    assert await read_exactly(reader, len(payload)) == payload
    writer.close()
    assert await read_to_eof(reader) == b""


async def test_unreachable_upstream_means_connect_then_eof(api: Api) -> None:
    proxy = await api.create("dead", f"127.0.0.1:{closed_port()}")
    reader, writer = await connect(proxy["listen"])  # accepted, not refused
    assert await read_to_eof(reader) == b""
    writer.close()


async def test_disabled_proxy_refuses_and_drops_open_connections(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    reader, writer = await connect(proxy["listen"])
    await round_trip(reader, writer)
    await api.call("PATCH", "/proxies/db", {"enabled": False})
    assert await read_to_eof(reader) == b""
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await connect(proxy["listen"])


async def test_deleting_a_proxy_drops_its_connections(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    reader, writer = await connect(proxy["listen"])
    await round_trip(reader, writer)
    await api.call("DELETE", "/proxies/db")
    assert await read_to_eof(reader) == b""
    writer.close()
    assert not await is_up(proxy["listen"])


async def test_latency_downstream(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="latency", attributes={"latency": 100})
    reader, writer = await connect(proxy["listen"])
    elapsed = await round_trip(reader, writer)
    assert 0.1 <= elapsed < 0.3
    writer.close()


async def test_latency_both_ways_adds_up(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="latency", stream="upstream", attributes={"latency": 100})
    await api.toxic("db", type="latency", stream="downstream", attributes={"latency": 50})
    reader, writer = await connect(proxy["listen"])
    elapsed = await round_trip(reader, writer, b"hello world " + b"a" * 32 * 1024 + b"\n")
    assert 0.15 <= elapsed < 0.4
    writer.close()


async def test_toxic_changes_apply_to_an_open_connection(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    reader, writer = await connect(proxy["listen"])
    assert await round_trip(reader, writer) < 0.1
    await api.toxic("db", type="latency", attributes={"latency": 100})
    assert 0.1 <= await round_trip(reader, writer) < 0.3
    await api.call("PATCH", "/proxies/db/toxics/latency_downstream", {"attributes": {"latency": 0}})
    assert await round_trip(reader, writer) < 0.1
    await api.call("DELETE", "/proxies/db/toxics/latency_downstream")
    assert await round_trip(reader, writer) < 0.1
    writer.close()


async def test_toxicity_zero_does_nothing(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="timeout", toxicity=0, attributes={"timeout": 0})
    reader, writer = await connect(proxy["listen"])
    assert await round_trip(reader, writer) < 0.1
    writer.close()


async def test_bandwidth_upstream(api: Api, peer_server: Upstream) -> None:
    proxy = await api.create("db", peer_server.address)
    await api.toxic("db", type="bandwidth", stream="upstream", attributes={"rate": 1000})
    _reader, writer = await connect(proxy["listen"])
    peer_reader, peer_writer = await peer_server.next_peer()
    payload = b"hello world " * 20_000  # 240 KB at 1000 KB/s: 240 ms
    start = time.perf_counter()
    writer.write(payload)
    assert await read_exactly(peer_reader, len(payload)) == payload
    assert 0.22 <= time.perf_counter() - start < 0.7
    writer.close()
    peer_writer.close()


async def test_timeout_closes_after_silence_and_drops_data(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="timeout", stream="upstream", attributes={"timeout": 100})
    reader, writer = await connect(proxy["listen"])
    start = time.perf_counter()
    writer.write(b"dropped")
    assert await read_to_eof(reader) == b""
    assert 0.1 <= time.perf_counter() - start < 0.4
    writer.close()


async def test_removing_a_timeout_closes_both_ends(api: Api, peer_server: Upstream) -> None:
    # TestTimeoutToxicClosesConnectionOnRemove
    proxy = await api.create("db", peer_server.address)
    reader, writer = await connect(proxy["listen"])
    peer_reader, peer_writer = await peer_server.next_peer()
    await api.toxic("db", type="timeout", name="to_delete", stream="upstream")
    await api.call("DELETE", "/proxies/db/toxics/to_delete")
    assert await read_to_eof(reader) == b""
    assert await read_to_eof(peer_reader) == b""
    writer.close()
    peer_writer.close()


@pytest.mark.parametrize("stream", ["upstream", "downstream"])
async def test_reset_peer_sends_rst(api: Api, echo: Upstream, stream: str) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="reset_peer", stream=stream, attributes={"timeout": 100})
    reader, writer = await connect(proxy["listen"])
    start = time.perf_counter()
    writer.write(b"hello\n")
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(100), 5)
    assert 0.1 <= time.perf_counter() - start < 0.4
    writer.close()


async def test_reset_peer_added_to_an_open_connection_closes_with_fin(
    api: Api, echo: Upstream
) -> None:
    proxy = await api.create("db", echo.address)
    reader, writer = await connect(proxy["listen"])
    await round_trip(reader, writer)
    await api.toxic("db", type="reset_peer", stream="upstream")
    writer.write(b"hello")
    assert await read_to_eof(reader) == b""  # EOF, not ECONNRESET: no SO_LINGER 0
    writer.close()


async def test_limit_data_truncates_then_closes(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="limit_data", attributes={"bytes": 10})
    reader, writer = await connect(proxy["listen"])
    writer.write(b"0123456789abcdefghij")
    assert await read_to_eof(reader) == b"0123456789"
    writer.close()


async def test_slicer_delays_between_pieces(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic(
        "db", type="slicer", attributes={"average_size": 5, "size_variation": 0, "delay": 20_000}
    )
    reader, writer = await connect(proxy["listen"])
    elapsed = await round_trip(reader, writer, b"x" * 20)  # 4 pieces, 20 ms apart
    assert 0.06 <= elapsed < 0.4
    writer.close()


async def test_slow_close_delays_the_close(api: Api, peer_server: Upstream) -> None:
    proxy = await api.create("db", peer_server.address)
    await api.toxic("db", type="slow_close", attributes={"delay": 150})
    reader, writer = await connect(proxy["listen"])
    _peer_reader, peer_writer = await peer_server.next_peer()
    peer_writer.write(b"bye")
    await peer_writer.drain()
    start = time.perf_counter()
    peer_writer.close()
    assert await read_exactly(reader, 3) == b"bye"
    assert await read_to_eof(reader) == b""
    assert 0.15 <= time.perf_counter() - start < 0.45
    writer.close()


async def test_reset_clears_toxics_on_open_connections(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="latency", attributes={"latency": 100})
    reader, writer = await connect(proxy["listen"])
    assert await round_trip(reader, writer) >= 0.1
    assert (await api.call("POST", "/reset")).status == 204
    assert await round_trip(reader, writer) < 0.1
    writer.close()


async def test_many_concurrent_connections(api: Api, echo: Upstream) -> None:
    proxy = await api.create("db", echo.address)
    await api.toxic("db", type="latency", attributes={"latency": 20})

    async def client(number: int) -> bytes:
        reader, writer = await connect(proxy["listen"])
        payload = f"client {number}".encode()
        writer.write(payload)
        data = await read_exactly(reader, len(payload))
        writer.close()
        return data

    results = await asyncio.gather(*(client(n) for n in range(50)))
    assert results == [f"client {n}".encode() for n in range(50)]

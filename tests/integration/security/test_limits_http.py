"""Input limits (:mod:`gtm.http_limits`) seen from the outside: real sockets, raw HTTP
where a well-behaved client library would refuse to misbehave."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.gpu_profiles import LLAMA_8B
from gtm.http_limits import HttpLimits, limited_app
from gtm.metrics import new_registry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: Short timeouts so that cut-offs are observable quickly; bounds are asserted below.
LIMITS = HttpLimits(
    max_headers=20,
    max_header_line_bytes=1024,
    max_header_bytes=4096,
    max_json_depth=8,
    header_timeout_s=0.5,
    body_timeout_s=0.5,
    lingering_s=0.5,
    max_concurrent_per_client=2,
)
MAX_BODY = 64 << 10


@dataclass
class Server:
    host: str
    port: int
    release: asyncio.Event
    entered: asyncio.Queue[None]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response({"bytes": len(body)})


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    release = asyncio.Event()
    entered: asyncio.Queue[None] = asyncio.Queue()

    async def hold(request: web.Request) -> web.Response:
        entered.put_nowait(None)
        await release.wait()
        return web.json_response({"held": True})

    app = limited_app(LIMITS, client_max_size=MAX_BODY)
    app.router.add_post("/echo", _echo)
    app.router.add_get("/echo", _echo)
    app.router.add_get("/hold", hold)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Server("127.0.0.1", port, release, entered)
    finally:
        release.set()
        await runner.cleanup()


async def _raw(server: Server, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers until it closes."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1 << 20), 5.0)
    finally:
        writer.close()


def _status_and_json(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


async def test_too_many_headers_is_431_json(server: Server) -> None:
    headers = "".join(f"x-h{i}: v\r\n" for i in range(30))
    raw = await _raw(server, f"GET /echo HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    status, body = _status_and_json(raw)
    assert status == 431
    assert body["error"]["code"] == "headers_too_large"  # type: ignore[index]
    assert "header fields" in body["error"]["message"]  # type: ignore[index]


async def test_oversized_header_line_and_total_are_431(server: Server) -> None:
    big = "a" * 2000
    raw = await _raw(server, f"GET /echo HTTP/1.1\r\nHost: x\r\nx-big: {big}\r\n\r\n".encode())
    assert _status_and_json(raw)[0] == 431
    many = "".join(f"x-m{i}: {'b' * 900}\r\n" for i in range(6))  # 6 × ~910 > 4096
    raw = await _raw(server, f"GET /echo HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode())
    status, body = _status_and_json(raw)
    assert status == 431
    assert "bytes of header fields" in body["error"]["message"]  # type: ignore[index]


async def test_body_over_the_limit_is_413_by_length_and_by_chunks(server: Server) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.url}/echo", data=b"x" * (MAX_BODY + 1)) as response:
            assert response.status == 413
            assert (await response.json())["error"]["code"] == "body_too_large"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(MAX_BODY // 4096 + 2):
                yield b"y" * 4096

        async with session.post(f"{server.url}/echo", data=chunks()) as response:
            assert response.status == 413
        async with session.post(f"{server.url}/echo", data=b"z" * 100) as response:
            assert response.status == 200
            assert await response.json() == {"bytes": 100}


async def test_json_nested_too_deeply_is_400_before_parsing(server: Server) -> None:
    async with aiohttp.ClientSession() as session:
        deep = b"[" * 9 + b"]" * 9
        async with session.post(f"{server.url}/echo", data=deep) as response:
            assert response.status == 400
            body = await response.json()
            assert body["error"]["code"] == "invalid_json"
            assert "nested too deeply" in body["error"]["message"]
        # Brackets inside strings do not count; the limit itself is accepted.
        fine = json.dumps({"a": "[[[[[[[[[[[[[[[[", "b": [[[[[[[1]]]]]]]}).encode()
        async with session.post(f"{server.url}/echo", data=fine) as response:
            assert response.status == 200


async def test_slow_body_is_408_and_the_connection_closed(server: Server) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    started = time.monotonic()
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(1 << 16), 5.0)
    assert _status_and_json(raw)[0] == 408
    assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed by the server
    assert time.monotonic() - started < LIMITS.body_timeout_s + LIMITS.lingering_s + 2.0
    writer.close()


async def test_slowloris_is_cut_off_while_normal_clients_are_served(server: Server) -> None:
    """Ten raw sockets dribble header bytes; each is closed within the header timeout
    (plus scheduling slack) and, meanwhile, a normal client keeps getting answers."""

    async def slowloris() -> float:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        started = time.monotonic()
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
        try:
            for i in range(100):
                await asyncio.sleep(0.1)
                if reader.at_eof():
                    break
                writer.write(f"x-slow-{i}: 1\r\n".encode())
                await writer.drain()
        except ConnectionError:
            pass
        closed = await asyncio.wait_for(reader.read(), 10.0)
        writer.close()
        assert b"200 OK" not in closed
        return time.monotonic() - started

    async def normal() -> int:
        served = 0
        async with aiohttp.ClientSession() as session:
            for _ in range(10):
                async with session.get(f"{server.url}/echo") as response:
                    assert response.status == 200
                served += 1
                await asyncio.sleep(0.05)
        return served

    results = await asyncio.gather(*(slowloris() for _ in range(10)), normal())
    lasted, served = results[:-1], results[-1]
    assert served == 10
    assert all(t < LIMITS.header_timeout_s + 1.5 for t in lasted), lasted


async def test_concurrency_per_client_is_bounded_with_retry_after(server: Server) -> None:
    async with aiohttp.ClientSession() as session:

        async def hold() -> int:
            async with session.get(f"{server.url}/hold") as response:
                return response.status

        async def probe() -> int:
            for _ in range(2):
                await asyncio.wait_for(server.entered.get(), 5.0)
            async with session.get(f"{server.url}/echo") as response:
                assert response.headers["Retry-After"] == "1"
                assert (await response.json())["error"]["code"] == "client_concurrency"
                status = response.status
            server.release.set()
            return status

        assert list(await asyncio.gather(hold(), hold(), probe())) == [200, 200, 429]
        async with session.get(f"{server.url}/echo") as response:
            assert response.status == 200  # slots are given back


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_emulator_applies_its_limits() -> None:
    """A real tier server (the emulator) with the same limits: slowloris cut off, deep
    JSON refused, and a valid completion still answered."""
    config = GpuSimConfig(
        port=0, speedup=1000.0, models=(LLAMA_8B,), warmup_passes=0, limits=LIMITS
    )
    async with GpuSimServer(config, registry=new_registry()) as worker:
        host, port = "127.0.0.1", worker.port
        reader, writer = await asyncio.open_connection(host, port)
        started = time.monotonic()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10.0) == b""
        assert time.monotonic() - started < LIMITS.header_timeout_s + 1.5
        writer.close()
        async with aiohttp.ClientSession() as session:
            deep = {"model": LLAMA_8B, "prompt": "hi", "x": [[[[[[[[[[1]]]]]]]]]]}
            url = f"{worker.url}/v1/completions"
            async with session.post(url, json=deep) as response:
                assert response.status == 400
            ok = {"model": LLAMA_8B, "prompt": "hi", "max_tokens": 4}
            async with session.post(url, json=ok) as response:
                assert response.status == 200
                assert (await response.json())["choices"][0]["text"]

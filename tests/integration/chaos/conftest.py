"""A fault-proxy API on 127.0.0.1:0, an HTTP client for it, and TCP upstreams."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy
from prometheus_client import CollectorRegistry

from chaos.proxy import FaultProxyServer, FaultProxyService
from gtm.metrics import new_registry

#: Bound on any single wait in these tests, so a regression fails instead of hanging.
WAIT = 5.0


@dataclass
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Api:
    """The API under test and a raw HTTP client for it."""

    server: FaultProxyServer
    session: aiohttp.ClientSession
    registry: CollectorRegistry

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def service(self) -> FaultProxyService:
        return self.server.service

    async def call(
        self,
        method: str,
        path: str,
        payload: object = None,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        body = data if data is not None else (None if payload is None else json.dumps(payload))
        async with self.session.request(
            method, self.url + path, data=body, headers=headers
        ) as response:
            return Reply(response.status, response.headers, await response.read())

    async def create(self, name: str, upstream: str, **extra: object) -> dict[str, Any]:
        reply = await self.call(
            "POST",
            "/proxies",
            {"name": name, "upstream": upstream, "listen": "127.0.0.1:0", **extra},
        )
        assert reply.status == 201, reply.body
        created: dict[str, Any] = reply.json()
        return created

    async def toxic(self, proxy: str, **toxic: object) -> dict[str, Any]:
        reply = await self.call("POST", f"/proxies/{proxy}/toxics", toxic)
        assert reply.status == 200, reply.body
        created: dict[str, Any] = reply.json()
        return created


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    registry = new_registry()
    service = FaultProxyService(registry=registry, rng=random.Random(1))
    server = FaultProxyServer(service, registry)
    await server.start("127.0.0.1", 0)
    timeout = aiohttp.ClientTimeout(total=WAIT)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            yield Api(server, session, registry)
    finally:
        await server.close()


@dataclass
class Upstream:
    """A TCP server on loopback; ``echo`` echoes, otherwise the test drives the peer."""

    echo: bool = True
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(
        default_factory=asyncio.Queue
    )
    server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.echo:
            await self.accepted.put((reader, writer))
            return
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def next_peer(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(self.accepted.get(), WAIT)


@asynccontextmanager
async def _upstream(echo: bool) -> AsyncIterator[Upstream]:
    upstream = Upstream(echo=echo)
    upstream.server = await asyncio.start_server(upstream._handle, "127.0.0.1", 0)
    try:
        yield upstream
    finally:
        upstream.server.close()
        while not upstream.accepted.empty():
            _reader, writer = upstream.accepted.get_nowait()
            writer.transport.abort()


@pytest.fixture
async def echo() -> AsyncIterator[Upstream]:
    async with _upstream(echo=True) as upstream:
        yield upstream


@pytest.fixture
async def peer_server() -> AsyncIterator[Upstream]:
    async with _upstream(echo=False) as upstream:
        yield upstream


async def connect(listen: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = listen.rsplit(":", 1)
    return await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), WAIT)


async def is_up(listen: str) -> bool:
    """Does ``listen`` accept connections? (Toxiproxy's AssertProxyUp.)"""
    try:
        _reader, writer = await connect(listen)
    except ConnectionRefusedError:
        return False
    writer.transport.abort()
    return True


async def read_exactly(reader: asyncio.StreamReader, size: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(size), WAIT)


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), WAIT)

"""The lean HTTP/1.1 server (gtm.http1) on real loopback sockets, with aiohttp's server
behind it on the same listener: real clients (aiohttp's, raw sockets for what a client
library would not send)."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from gtm import access
from gtm.clock import SystemClock
from gtm.errors import ConfigError
from gtm.http1 import Fallback, LeanFront, Request, Route
from gtm.http_limits import LIMITS_KEY, HttpLimits, ServerLimits, limited_app
from gtm.metrics import new_registry
from gtm.models import Tier
from gtm.openai_errors import ApiError, error_middleware
from gtm.pki import CertificateAuthority
from gtm.relay import Downstream
from gtm.serve import HttpServer
from gtm.tls import TlsConfig, TlsMaterial, connector_ssl, peer_identities

ECHO = "/v1/echo"
STREAM = "/v1/stream"
HANG = "/v1/hang"
BROKEN = "/v1/broken"
OTHER = "/other"
LIMITS = HttpLimits(max_headers=10, max_json_depth=4, header_timeout_s=0.3, body_timeout_s=0.3)
MAX_BODY = 4096
#: A bound on waits for the server (an event's arrival, not a sleep).
WAIT_S = 5.0


Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Each test on asyncio's loop and on uvloop (gtm zone's): their transports differ."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def go(case: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(case)

    return go


@dataclass
class Served:
    """A server on loopback and what its handlers saw."""

    server: HttpServer
    registry: CollectorRegistry
    host: str
    port: int
    counted: list[tuple[str, int]]
    hanging: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    peers: list[tuple[str, ...]] = field(default_factory=list)

    def fallbacks(self, reason: Fallback) -> float:
        value = self.registry.get_sample_value(
            "gtm_http_fallbacks_total", {"tier": "zone", "reason": reason.value}
        )
        return value or 0.0

    @property
    def url(self) -> str:
        return self.server.bound.url if self.server.bound else ""


async def _echo(request: Request, client: Downstream) -> None:
    headers = CIMultiDict({"Content-Type": "application/json", "x-seen": request.path})
    client.whole(200, "OK", headers, request.body)


async def _stream(request: Request, client: Downstream) -> None:
    await client.start(200, "OK", CIMultiDict({"Content-Type": "text/event-stream"}), None)
    for i in range(3):
        await client.write(b"data: %d\n\n" % i)
    await client.write_eof()


async def _broken(request: Request, client: Downstream) -> None:
    raise ApiError(418, "no coffee here", code="teapot")


def _app(served: Served) -> web.Application:
    def count(route: str, status: int) -> None:
        served.counted.append((route, status))

    app = limited_app(
        LIMITS, client_max_size=MAX_BODY, middlewares=[error_middleware("test", count)]
    )

    async def other(request: web.Request) -> web.Response:
        return web.json_response({"server": "aiohttp"})

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"server": "aiohttp", "body": (await request.read()).decode()})

    app.router.add_get(OTHER, other)
    app.router.add_post(ECHO, echo)
    return app


@asynccontextmanager
async def serving(
    ssl_context: ssl.SSLContext | None = None, *, lean: bool = True
) -> AsyncIterator[Served]:
    registry = new_registry()
    served = Served(HttpServer(web.Application()), registry, "", 0, [])

    async def hang(request: Request, client: Downstream) -> None:
        served.peers.append(
            peer_identities(request.transport.get_extra_info("peercert")) if ssl_context else ()
        )
        served.hanging.set()
        try:
            await served.release.wait()
        except asyncio.CancelledError:
            served.cancelled.set()
            raise
        await _echo(request, client)

    app = _app(served)
    log = access.install(app, "zone", registry=registry)
    front = LeanFront(
        [
            Route("POST", ECHO, _echo),
            Route("POST", STREAM, _stream),
            Route("POST", HANG, hang),
            Route("POST", BROKEN, _broken),
        ],
        tier=Tier.ZONE,
        limits=app[LIMITS_KEY],
        service="test",
        count=lambda route, status: served.counted.append((route, status)),
        registry=registry,
        access=log,
    )
    server = HttpServer(app, ssl_context=ssl_context, lean=front if lean else None)
    bound = await server.start()
    served.server, served.host, served.port = server, bound.host, bound.port
    try:
        yield served
    finally:
        await server.stop()


async def _raw(served: Served, data: bytes, *, until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(WAIT_S):
            return await reader.read() if until_close else await reader.read(65536)
    finally:
        writer.close()


def _post(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: t", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _responses(reader: asyncio.StreamReader, count: int) -> list[tuple[int, bytes]]:
    """``count`` Content-Length responses off one connection: (status, body)."""
    out = []
    for _ in range(count):
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length")
        )
        out.append((int(lines[0].split()[1]), await reader.readexactly(length)))
    return out


async def _a_hot_post_is_answered_by_the_lean_server() -> None:
    async with serving() as served, aiohttp.ClientSession() as session:
        async with session.post(served.url + ECHO, data=b'{"a": 1}') as response:
            assert response.status == 200
            assert response.headers["x-seen"] == ECHO
            assert await response.read() == b'{"a": 1}'
        async with session.post(served.url + STREAM, data=b"{}") as response:
            assert response.headers["Transfer-Encoding"] == "chunked"
            assert await response.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert served.counted == [(ECHO, 200), (STREAM, 200)]
        assert all(served.fallbacks(r) == 0 for r in Fallback)


def test_a_hot_post_is_answered_by_the_lean_server(run: Run) -> None:
    run(_a_hot_post_is_answered_by_the_lean_server())


async def _keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(ECHO, b'{"n": 1}'))
        assert await _responses(reader, 1) == [(200, b'{"n": 1}')]
        # Two in one write and the head of a third, whose body comes in another write.
        third = _post(ECHO, b'{"n": 4}')
        writer.write(_post(ECHO, b'{"n": 2}') + _post(ECHO, b'{"n": 3}') + third[:-3])
        await writer.drain()
        writer.write(third[-3:])
        got = await _responses(reader, 3)
        writer.close()
    assert got == [(200, b'{"n": 2}'), (200, b'{"n": 3}'), (200, b'{"n": 4}')]


def test_keep_alive_and_pipelined_requests_are_answered_in_order(run: Run) -> None:
    run(_keep_alive_and_pipelined_requests_are_answered_in_order())


async def _a_whole_response_reaches_the_client_before_its_handler_returns() -> None:
    """The relay's bookkeeping (releases, observations) runs after its whole response
    was written: the client does not wait for it. The connection's next request, sent
    meanwhile, is answered once the handler has ended."""
    ended = asyncio.Event()

    async def answer_then_work(request: Request, client: Downstream) -> None:
        client.whole(200, "OK", CIMultiDict({"Content-Type": "application/json"}), b'{"ok": 1}')
        await served.release.wait()  # the bookkeeping after the answer
        ended.set()

    async with serving() as served:
        front = served.server._lean
        assert front is not None
        after = "/v1/after"
        front.routes = {
            **front.routes,
            (b"POST", after.encode()): (answer_then_work, "POST", after),
        }
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(after, b"{}"))
        assert await _responses(reader, 1) == [(200, b'{"ok": 1}')]
        assert not ended.is_set()
        writer.write(_post(ECHO, b'{"n": 2}'))
        await writer.drain()
        served.release.set()
        assert await _responses(reader, 1) == [(200, b'{"n": 2}')]
        writer.close()
        assert ended.is_set()
        assert served.counted == [(after, 200), (ECHO, 200)]


def test_a_whole_response_reaches_the_client_before_its_handler_returns(run: Run) -> None:
    run(_a_whole_response_reaches_the_client_before_its_handler_returns())


async def _one_connections_requests_are_each_read_as_if_alone() -> None:
    """One parser reads all of a connection's requests: after a body, none, a refusal
    that keeps the connection, a handler's error, a query, HTTP/1.0 keep-alive, each
    next head is read from its start, with the fields as sent."""
    seen: list[tuple[str, str, str, list[tuple[str, str]], list[tuple[bytes, bytes]]]] = []

    async def look(request: Request, client: Downstream) -> None:
        fields = list(request.headers.items())
        assert request.fields == fields  # the list beside the mapping: the same fields
        seen.append((request.version, request.path, request.query, fields, request.raw_headers))
        client.whole(200, "OK", CIMultiDict({"x-fields": str(len(fields))}), request.body)

    deep = b"[" * 5 + b"]" * 5
    async with serving() as served:
        front = served.server._lean
        assert front is not None
        front.routes = {**front.routes, (b"POST", b"/v1/look"): (look, "POST", "/v1/look")}
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(
            _post(ECHO, b'{"n": 1}')
            + _post(ECHO, deep)
            + _post(BROKEN, b"{}")
            + b"POST /v1/look HTTP/1.1\r\nHost: t\r\n\r\n"
            + b"POST /v1/look?a=1&b=%20 HTTP/1.1\r\ncontent-length: 2\r\nX-Odd: \xff\xfe\r\n\r\n{}"
            + _post("/v1/look", b"{}", "Connection: keep-alive", version="1.0")
            + _post(ECHO, b'{"n": 2}')
        )
        got = await _responses(reader, 7)
        writer.write(b"GET /other HTTP/1.1\r\nHost: t\r\n\r\n")
        (status, body), = await _responses(reader, 1)  # fmt: skip
        writer.close()
    assert [s for s, _ in got] == [200, 400, 418, 200, 200, 200, 200]
    assert (got[0][1], got[6][1]) == (b'{"n": 1}', b'{"n": 2}')
    assert (status, json.loads(body)) == (200, {"server": "aiohttp"})
    assert seen == [
        ("1.1", "/v1/look", "", [("Host", "t")], [(b"Host", b"t")]),
        (
            "1.1",
            "/v1/look",
            "a=1&b=%20",
            [("content-length", "2"), ("X-Odd", "\udcff\udcfe")],
            [(b"content-length", b"2"), (b"X-Odd", b"\xff\xfe")],
        ),
        (
            "1.0",
            "/v1/look",
            "",
            [("Host", "t"), ("Content-Length", "2"), ("Connection", "keep-alive")],
            [(b"Host", b"t"), (b"Content-Length", b"2"), (b"Connection", b"keep-alive")],
        ),
    ]


def test_one_connections_requests_are_each_read_as_if_alone(run: Run) -> None:
    run(_one_connections_requests_are_each_read_as_if_alone())


async def _a_connection_that_asks_for_another_path_becomes_aiohttps() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(ECHO, b'{"hot": true}'))
        assert await _responses(reader, 1) == [(200, b'{"hot": true}')]
        writer.write(b"GET /other HTTP/1.1\r\nHost: t\r\n\r\n" + _post(ECHO, b"{}"))
        (status, body), (status2, body2) = await _responses(reader, 2)
        writer.close()
        assert (status, json.loads(body)) == (200, {"server": "aiohttp"})
        # The connection stays aiohttp's: the next hot request is answered there.
        assert (status2, json.loads(body2)) == (200, {"server": "aiohttp", "body": "{}"})
        assert served.fallbacks(Fallback.ROUTE) == 1


def test_a_connection_that_asks_for_another_path_becomes_aiohttps(run: Run) -> None:
    run(_a_connection_that_asks_for_another_path_becomes_aiohttps())


async def _what_the_lean_server_does_not_serve_aiohttp_answers(
    request_bytes: bytes, reason: Fallback
) -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(request_bytes)
        if reason is Fallback.EXPECT:
            async with asyncio.timeout(WAIT_S):
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
        (status, body), = await _responses(reader, 1)  # fmt: skip
        writer.close()
        assert status == 200
        assert json.loads(body)["server"] == "aiohttp"
        assert served.fallbacks(reason) == 1


@pytest.mark.parametrize(
    ("request_bytes", "reason"),
    [
        (b"POST /v1/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         Fallback.CHUNKED),
        (b"POST /v1/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue"
         b"\r\n\r\n{}", Fallback.EXPECT),
        (b"POST /v1/%65cho HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}", Fallback.TARGET),
    ],
)  # fmt: skip
def test_what_the_lean_server_does_not_serve_aiohttp_answers(
    run: Run, request_bytes: bytes, reason: Fallback
) -> None:
    run(_what_the_lean_server_does_not_serve_aiohttp_answers(request_bytes, reason))


async def _a_malformed_request_gets_aiohttps_own_400(garbage: bytes) -> None:
    async with serving(lean=False) as plain:
        expected = await _raw(plain, garbage)
    async with serving() as served:
        got = await _raw(served, garbage)
        assert served.fallbacks(Fallback.MALFORMED) + served.fallbacks(Fallback.VERSION) == 1
    assert got.split(b"\r\n", 1)[0] == expected.split(b"\r\n", 1)[0]
    assert got.startswith(b"HTTP/1.")
    assert b" 400 " in got.split(b"\r\n", 1)[0]
    assert got.split(b"\r\n\r\n", 1)[1] == expected.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize(
    "garbage",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/echo HTTP/1.1\r\nHost: t\r\nContent-Length: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ],
)
def test_a_malformed_request_gets_aiohttps_own_400(run: Run, garbage: bytes) -> None:
    run(_a_malformed_request_gets_aiohttps_own_400(garbage))


async def _the_limits_are_aiohttps() -> None:
    many = [f"x-h{i}: v" for i in range(LIMITS.max_headers + 1)]
    deep = b"[" * 5 + b"]" * 5
    cases = [
        (_post(ECHO, b"{}", *many), 431, "headers_too_large"),
        (_post(ECHO, b"x" * (MAX_BODY + 1)), 413, "body_too_large"),
        (_post(ECHO, deep), 400, "invalid_json"),
        (_post(BROKEN, b"{}"), 418, "teapot"),
    ]
    for lean in (False, True):
        async with serving(lean=lean) as served:
            for request_bytes, status, code in cases:
                reader, writer = await asyncio.open_connection(served.host, served.port)
                writer.write(request_bytes)
                if status == 418 and not lean:
                    writer.close()
                    continue  # aiohttp's app has no such route
                (got, body), = await _responses(reader, 1)  # fmt: skip
                writer.close()
                assert (got, json.loads(body)["error"]["code"]) == (status, code), lean


def test_the_limits_are_aiohttps(run: Run) -> None:
    run(_the_limits_are_aiohttps())


async def _a_slow_body_is_a_408_and_a_slow_head_is_closed() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(ECHO, b'{"a": 1}')[:-3])
        (status, body), = await _responses(reader, 1)  # fmt: skip
        assert (status, json.loads(body)["error"]["code"]) == (408, "body_timeout")
        writer.close()
        # Half a head, then nothing: the connection is closed after header_timeout_s.
        got = await _raw(served, b"POST /v1/echo HTTP/1.1\r\nHost: t\r\n")
        assert got == b""


def test_a_slow_body_is_a_408_and_a_slow_head_is_closed(run: Run) -> None:
    run(_a_slow_body_is_a_408_and_a_slow_head_is_closed())


async def _a_client_that_leaves_cancels_its_handler() -> None:
    async with serving() as served:
        _reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(HANG, b"{}"))
        async with asyncio.timeout(WAIT_S):
            await served.hanging.wait()
        writer.close()
        async with asyncio.timeout(WAIT_S):
            await served.cancelled.wait()


def test_a_client_that_leaves_cancels_its_handler(run: Run) -> None:
    run(_a_client_that_leaves_cancels_its_handler())


async def _a_graceful_stop_finishes_the_request_in_flight() -> None:
    async with serving() as served:
        idle_reader, idle_writer = await asyncio.open_connection(served.host, served.port)
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(HANG, b'{"last": 1}'))
        async with asyncio.timeout(WAIT_S):
            await served.hanging.wait()
        stopping = asyncio.get_running_loop().create_task(served.server.stop())
        async with asyncio.timeout(WAIT_S):
            assert await idle_reader.read() == b""  # the idle connection is closed
        served.release.set()
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert b"Connection: close" in head
            assert await reader.read() == b'{"last": 1}'
            await stopping
        assert not served.cancelled.is_set()
        idle_writer.close()
        writer.close()


def test_a_graceful_stop_finishes_the_request_in_flight(run: Run) -> None:
    run(_a_graceful_stop_finishes_the_request_in_flight())


async def _writes_wait_for_a_slow_clients_buffer() -> None:
    """A 8 MiB stream through a client that reads 64 KiB at a time: the server's write
    buffer never holds much more than one chunk (it waits while paused)."""
    sizes: list[int] = []
    chunk = b"x" * (1 << 20)

    async def big(request: Request, client: Downstream) -> None:
        await client.start(200, "OK", CIMultiDict(), 8 * len(chunk))
        for _ in range(8):
            await client.write(chunk)
            sizes.append(request.transport.get_write_buffer_size())
        await client.write_eof()

    async with serving() as served:
        front = served.server._lean
        assert front is not None
        front.routes = {**front.routes, (b"POST", b"/v1/big"): (big, "POST", "/v1/big")}
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post("/v1/big", b"{}"))
        async with asyncio.timeout(WAIT_S):
            await reader.readuntil(b"\r\n\r\n")
            got = 0
            while got < 8 * len(chunk):
                got += len(await reader.read(65536))
        writer.close()
    assert len(sizes) == 8
    assert max(sizes) <= 2 * len(chunk)


def test_writes_wait_for_a_slow_clients_buffer(run: Run) -> None:
    run(_writes_wait_for_a_slow_clients_buffer())


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = CertificateAuthority.create("gtm test CA")
    ca_path = ca.write(tmp_path / "ca.pem")

    def material(identity: str, **patterns: tuple[str, ...]) -> TlsMaterial:
        stem = identity.replace("/", "-")
        cert, key = ca.issue(identity).write(tmp_path / f"{stem}.pem", tmp_path / f"{stem}-key.pem")
        config = TlsConfig(
            ca_path, cert, key, patterns.get("peers", ()), patterns.get("clients", ())
        )
        return TlsMaterial(config, clock=SystemClock(), registry=new_registry())

    server = material("zone/z1", clients=("region/*",)).server_context()
    client = material("region/r1", peers=("zone/*",)).client_context()
    return server, client


async def _tls_serves_hands_off_and_shows_the_peer_certificate(tmp_path: Path) -> None:
    server_ssl, client_ssl = _tls(tmp_path)
    async with serving(server_ssl) as served:
        served.release.set()
        connector = aiohttp.TCPConnector(ssl=connector_ssl(client_ssl), limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.post(served.url + HANG, data=b"{}") as response:
                assert (response.status, await response.read()) == (200, b"{}")
            async with session.get(served.url + OTHER) as response:  # the same connection
                assert await response.json() == {"server": "aiohttp"}
        assert served.peers == [("region/r1",)]
        assert served.fallbacks(Fallback.ROUTE) == 1


def test_tls_serves_hands_off_and_shows_the_peer_certificate(run: Run, tmp_path: Path) -> None:
    run(_tls_serves_hands_off_and_shows_the_peer_certificate(tmp_path))


async def _an_access_line_per_lean_request(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gtm.access.zone")
    async with (
        serving() as served,
        aiohttp.ClientSession() as session,
        session.post(served.url + ECHO, data=b"{}", headers={"x-request-id": "rid-1"}) as response,
    ):
        assert response.headers["x-request-id"] == "rid-1"
    lines = [r for r in caplog.records if r.name == "gtm.access.zone"]
    assert [r.getMessage() for r in lines] == [f"POST {ECHO} 200"]


def test_an_access_line_per_lean_request(run: Run, caplog: pytest.LogCaptureFixture) -> None:
    run(_an_access_line_per_lean_request(caplog))


async def _an_idle_kept_alive_connection_is_closed_and_a_taken_port_refused() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        for n in range(3):
            writer.write(_post(ECHO, b'{"n": %d}' % n))
            assert await _responses(reader, 1) == [(200, b'{"n": %d}' % n)]
        async with asyncio.timeout(WAIT_S):
            assert await reader.read() == b""  # closed after header_timeout_s idle
        writer.close()
        front = LeanFront(
            [], tier=Tier.ZONE, limits=app_limits(), service="t", count=lambda r, s: None,
            registry=new_registry(),
        )  # fmt: skip
        taken = HttpServer(web.Application(), served.host, served.port, lean=front)
        with pytest.raises(ConfigError, match="cannot listen"):
            await taken.start()


def app_limits() -> ServerLimits:
    return ServerLimits(LIMITS, MAX_BODY)


def test_an_idle_kept_alive_connection_is_closed_and_a_taken_port_refused(run: Run) -> None:
    run(_an_idle_kept_alive_connection_is_closed_and_a_taken_port_refused())

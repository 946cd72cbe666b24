"""The one server start-up helper on loopback: bind, report, serve, stop gracefully."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from gtm.errors import ConfigError
from gtm.serve import (
    SHUTDOWN_GRACE_S,
    HttpServer,
    add_service_routes,
    base_url,
    serving,
    until_signalled,
)


def _app(
    entered: asyncio.Event | None = None, release: asyncio.Event | None = None
) -> web.Application:
    async def slow(request: web.Request) -> web.Response:
        if entered is not None and release is not None:
            entered.set()
            await release.wait()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/", slow)
    return app


async def test_a_server_binds_a_free_port_reports_its_url_and_stops() -> None:
    server = HttpServer(_app(), "127.0.0.1", 0)
    bound = await server.start()
    assert bound.port > 0
    assert bound.url == f"http://127.0.0.1:{bound.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(bound.url) as response:
            assert await response.text() == "done"
        await server.stop()
        await server.stop()  # idempotent
        assert not server.running
        with pytest.raises(aiohttp.ClientConnectorError):
            await http.get(bound.url)


async def test_a_taken_port_is_a_config_error_naming_the_address() -> None:
    async with serving(_app()) as bound:
        with pytest.raises(ConfigError, match=f"127.0.0.1:{bound.port}"):
            await HttpServer(_app(), "127.0.0.1", bound.port, what="the test").start()


async def test_an_in_flight_request_finishes_while_the_server_stops() -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    server = HttpServer(_app(entered, release))
    bound = await server.start()
    async with aiohttp.ClientSession() as http:
        request = asyncio.ensure_future(http.get(bound.url))  # noqa: TID251
        await entered.wait()
        stopping = asyncio.ensure_future(server.stop())  # noqa: TID251
        await asyncio.sleep(0)  # let stop() close the listener first
        release.set()
        async with await request as response:
            assert response.status == 200
            assert await response.text() == "done"
        await stopping


def test_ipv6_hosts_are_bracketed_in_urls() -> None:
    assert base_url("::1", 8080) == "http://[::1]:8080"
    assert base_url("10.0.0.1", 443) == "http://10.0.0.1:443"


def test_one_shutdown_grace_for_every_server() -> None:
    assert 0 < SHUTDOWN_GRACE_S <= 30  # below an orchestrator's kill timeout


async def test_until_signalled_returns_on_the_signal_and_removes_its_handler() -> None:
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(until_signalled((signal.SIGUSR1,)))  # noqa: TID251
    await asyncio.sleep(0)  # the handler is installed
    os.kill(os.getpid(), signal.SIGUSR1)
    await asyncio.wait_for(waiting, 5.0)
    assert not loop.remove_signal_handler(signal.SIGUSR1)  # already gone


async def test_every_service_gets_healthz_its_readyz_and_its_metrics() -> None:
    registry = CollectorRegistry()
    Counter("gtm_test_things", "Things.", registry=registry).inc()

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"ready": False}, status=503)

    app = web.Application()
    add_service_routes(app, registry=registry, readyz=readyz)
    async with serving(app) as bound, aiohttp.ClientSession() as http:
        async with http.get(f"{bound.url}/healthz") as response:
            assert response.status == 200
            assert await response.json() == {"status": "ok"}
        async with http.get(f"{bound.url}/readyz") as response:
            assert response.status == 503
        async with http.get(f"{bound.url}/metrics") as response:
            assert response.content_type == "text/plain"
            assert "gtm_test_things_total 1.0" in await response.text()


@pytest.mark.parametrize(
    ("sent", "complaint"),
    [
        # sglang-router's HTTP/2 probe at a worker's join.
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "Pause on PRI/Upgrade (BadHttpMessage)"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nine\r\n\r\n",
            "Invalid character in Content-Length (BadHttpMessage)",
        ),
    ],
)
async def test_a_malformed_request_is_a_400_and_one_log_line_without_traceback(
    caplog: pytest.LogCaptureFixture, sent: bytes, complaint: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    async with serving(_app()) as bound:
        reader, writer = await asyncio.open_connection(bound.host, bound.port)
        writer.write(sent)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10.0)
        writer.close()
        await writer.wait_closed()
        async with aiohttp.ClientSession() as http, http.get(bound.url) as response:
            assert await response.text() == "done"  # still serving
    assert answer == b"" or answer.split(b"\r\n")[0].split(b" ")[1] == b"400", answer
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [r.levelno for r in records] == [logging.INFO], caplog.text
    assert records[0].exc_info is None
    assert "\n" not in records[0].getMessage()
    assert records[0].getMessage().endswith(complaint), records[0].getMessage()
    assert "Traceback" not in caplog.text

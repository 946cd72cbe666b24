"""``gtm load``'s outcome of a stream, against a real aiohttp server on loopback: an
answer that ends with ``[DONE]`` succeeds; one cut mid-body, one that carries OpenAI's
error event, and one that ends without ``[DONE]`` fail, each with its own reason, and
the summary counts them apart. After ``[DONE]`` the body is read to its end: the client
never leaves before its response ended (the front door saw it leave, before)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor
from gtmctl.load import LoadConfig, Outcome, StreamBreak, Tally, render_summary, send_one

pytestmark = pytest.mark.integration

TOKEN = b'data: {"choices": [{"index": 0, "delta": {"content": " word"}}]}\n\n'
DONE = b"data: [DONE]\n\n"
ERROR = (
    b'data: {"error": {"message": "the upstream failed mid-response", '
    b'"type": "server_error", "param": null, "code": "upstream_reset"}}\n\n'
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


async def whole(request: web.Request) -> web.StreamResponse:
    response = await sse(request)
    await response.write(TOKEN)
    await response.write(DONE)
    await response.write_eof()
    return response


async def cut(request: web.Request) -> web.StreamResponse:
    response = await sse(request)
    await response.write(TOKEN)
    assert request.transport is not None
    request.transport.abort()  # no last chunk: a broken connection
    return response


async def error_event(request: web.Request) -> web.StreamResponse:
    response = await sse(request)
    await response.write(TOKEN)
    await response.write(ERROR)
    await response.write_eof()
    return response


async def no_done(request: web.Request) -> web.StreamResponse:
    response = await sse(request)
    await response.write(TOKEN)
    await response.write_eof()
    return response


Serve = Callable[[Handler], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[TestServer] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


async def outcome(url: str) -> Outcome:
    async with aiohttp.ClientSession() as session:
        return await send_one(session, LoadConfig(url=url), {"stream": True}, {}, "Berlin, DE")


async def test_a_whole_stream_succeeds_with_its_ttft(serve: Serve) -> None:
    result = await outcome(await serve(whole))
    assert result.ok
    assert result.reason == ""
    assert result.ttft_s is not None


@pytest.mark.parametrize(
    ("handler", "reason"),
    [
        (cut, "cut-stream:ClientPayloadError"),
        (error_event, "stream-error:upstream_reset"),
        (no_done, "truncated-stream"),
    ],
)
async def test_a_stream_that_breaks_after_its_first_byte_fails_with_its_own_reason(
    serve: Serve, handler: Handler, reason: str
) -> None:
    result = await outcome(await serve(handler))
    assert not result.ok
    assert result.status == 200
    assert result.reason == reason
    assert result.ttft_s is not None  # the first token came before the break


async def test_the_summary_counts_cut_streams_apart(serve: Serve) -> None:
    tally = Tally(scheduled=5)
    for handler in (whole, cut, error_event, error_event, no_done):
        tally.add(await outcome(await serve(handler)))
    tally.add(Outcome(False, 429, reason="http-429:rate_limit_exceeded"))
    summary = tally.summary()
    assert summary["failed"] == 5
    assert summary["cut_streams"] == 4
    assert summary["cut_stream_kinds"] == {
        StreamBreak.ERROR_EVENT.value: 2,
        StreamBreak.CUT.value: 1,
        StreamBreak.TRUNCATED.value: 1,
    }
    text = render_summary(summary, "summary")
    assert "cut        4 streams broke after the first byte" in text
    assert "stream-error 2" in text


async def test_after_done_the_body_is_read_to_its_end(serve: Serve) -> None:
    done_sent = asyncio.Event()
    end = asyncio.Event()
    ended: list[str] = []

    async def slow_end(request: web.Request) -> web.StreamResponse:
        response = await sse(request)
        await response.write(TOKEN)
        await response.write(DONE)
        done_sent.set()
        try:
            await end.wait()  # the last chunk comes later
            await response.write_eof()
        except asyncio.CancelledError:
            ended.append("client left")
            raise
        ended.append("completed")
        return response

    url = await serve(slow_end)
    async with TaskSupervisor(registry=new_registry()) as tasks:
        request = tasks.spawn("request", outcome(url))
        await asyncio.wait_for(done_sent.wait(), 10.0)
        # [DONE] is out; the client waits for the body's end instead of dropping the
        # connection (aiohttp closes a connection whose body was not read to its end).
        assert not request.done()
        end.set()
        result = await asyncio.wait_for(request, 10.0)
    assert result.ok
    assert ended == ["completed"]

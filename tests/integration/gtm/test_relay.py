"""The core relay on a loopback server, with scripted upstreams: retries only before the
first byte, bounded attempts, cut streams (the error event, the reset, the break counts
and their log lines), header rules, releases on every path."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from gtm.errors import AttemptFailed, UpstreamError
from gtm.metrics import new_registry
from gtm.models import Tier
from gtm.openai_errors import ApiError
from gtm.relay import BreakCause, Ending, Failure, Relay, StreamBreaks, Upstream

SSE = {"content-type": "text/event-stream; charset=utf-8"}


@dataclass
class Scripted:
    """A fake upstream response: status, headers, then body chunks or an error."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=CIMultiDict)
    #: ``None``: never answer (a silent upstream).
    chunks: Sequence[bytes | BaseException | None] = (b"ok",)
    content_length: int | None = None
    reason: str = "OK"
    #: Never offered whole: the relay reads every chunk.
    body: bytes | None = None
    fields: list[tuple[str, str]] | None = None
    released: bool = False
    closed: bool = False
    _next: int = 0

    async def readany(self) -> bytes:
        if self._next >= len(self.chunks):
            return b""
        item = self.chunks[self._next]
        self._next += 1
        if item is None:
            await asyncio.Event().wait()
            return b""
        if isinstance(item, BaseException):
            raise item
        return item

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


#: What ``open`` does for a target: answer, or raise.
Step = Scripted | BaseException | Callable[[], Scripted]


@dataclass
class Script:
    steps: dict[str, Step]
    order: list[str]
    opened: list[str] = field(default_factory=list)
    begun: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    finished: list[tuple[str, Ending]] = field(default_factory=list)
    deadline_passed: bool = False
    retry_4xx: bool = True
    #: Whether an UpstreamError from ``open`` is the tier's connect failure (else the
    #: relay's own translation, a reset).
    connect_errors: bool = False
    registry: CollectorRegistry = field(default_factory=new_registry)
    #: Set when a relayed response ended (``finished`` ran).
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def breaks(self, cause: BreakCause) -> float:
        labels = {"tier": "zone", "cause": cause.value}
        return self.registry.get_sample_value("gtm_stream_breaks_total", labels) or 0.0


class ScriptRelay(Relay[str]):
    def __init__(self, request: web.Request, script: Script, breaks: StreamBreaks) -> None:
        super().__init__(request, max_attempts=3, breaks=breaks)
        self.script = script

    def next_target(self, tried: frozenset[str]) -> str | None:
        return next((t for t in self.script.order if t not in tried), None)

    def target_id(self, target: str) -> str:
        return target

    def begin(self, target: str) -> Callable[[], None]:
        self.script.begun.append(target)
        return lambda: self.script.released.append(target)

    def first_byte_deadline(self, target: str) -> float | None:
        if self.script.deadline_passed:
            return asyncio.get_running_loop().time()  # already due: fails at once
        return None

    def retry_status(self, status: int) -> bool:
        if self.script.retry_4xx:
            return super().retry_status(status)
        return status >= 500

    async def open(self, target: str) -> Upstream:
        self.script.opened.append(target)
        step = self.script.steps[target]
        if isinstance(step, BaseException):
            raise step
        if callable(step) and not isinstance(step, Scripted):
            return step()
        return step

    def open_failed(self, error: UpstreamError | OSError) -> AttemptFailed:
        if self.script.connect_errors:
            return AttemptFailed(Failure.CONNECT, f"connect failed: {error}")
        return super().open_failed(error)

    def response_headers(self, target: str, headers: CIMultiDict[str]) -> None:
        headers["x-gtm-target"] = target

    def failed(self, target: str, failure: AttemptFailed) -> None:
        self.script.failed.append((target, failure.reason))

    def finished(self, target: str, ending: Ending) -> None:
        self.script.finished.append((target, ending))
        self.script.ended.set()

    def exhausted(self) -> Exception:
        return ApiError(502, "; ".join(f.detail for f in self.failures), code="exhausted")


#: Serve a script; a client session and the URL of its chat endpoint.
Serve = Callable[[Script], Awaitable[tuple[aiohttp.ClientSession, str]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[TestServer] = []
    sessions: list[aiohttp.ClientSession] = []

    async def start(script: Script) -> tuple[aiohttp.ClientSession, str]:
        breaks = StreamBreaks(script.registry, Tier.ZONE)

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await ScriptRelay(request, script, breaks).forward()
            except ApiError as exc:
                return exc.response()

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        # As gtm.serve: a client that goes away cancels its handler.
        server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
        await server.start_server()
        servers.append(server)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return session, str(server.make_url("/v1/chat/completions"))

    yield start
    for session in sessions:
        await session.close()
    for server in servers:
        await server.close()


async def test_a_5xx_before_the_first_byte_moves_on_and_releases_each_attempt(serve: Serve) -> None:
    broken = Scripted(status=503, chunks=(b"busy",))
    good = Scripted(headers={"content-type": "application/json"}, chunks=(b'{"a":', b"1}"))
    script = Script({"a": broken, "b": good}, ["a", "b"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert response.status == 200
        assert await response.read() == b'{"a":1}'
        assert response.headers["x-gtm-target"] == "b"
    assert script.begun == script.released == ["a", "b"]
    assert script.failed == [("a", "http_503")]
    assert script.finished == [("b", Ending.COMPLETED)]
    assert broken.closed
    assert not broken.released
    assert good.released
    assert not good.closed


async def test_a_body_that_came_whole_with_its_head_is_answered_without_a_read(
    serve: Serve,
) -> None:
    # Reading it would fail: the relay must answer the body it was offered.
    whole = Scripted(
        headers={"content-type": "application/json"},
        body=b'{"a":1}',
        content_length=7,
        chunks=(UpstreamError("read although the body came whole"),),
    )
    script = Script({"a": whole}, ["a"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert response.status == 200
        assert await response.read() == b'{"a":1}'
        assert response.headers["x-gtm-target"] == "a"
    assert script.finished == [("a", Ending.COMPLETED)]
    assert whole.released
    assert not whole.closed


async def test_an_upstream_error_before_the_head_is_the_tiers_open_failure(serve: Serve) -> None:
    script = Script({"a": UpstreamError("refused"), "b": Scripted()}, ["a", "b"])
    script.connect_errors = True
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert response.status == 200
        assert await response.read() == b"ok"
    assert script.failed == [("a", "connect")]
    assert script.released == ["a", "b"]


async def test_attempts_are_bounded_and_the_tier_error_answers(serve: Serve) -> None:
    steps: dict[str, Step] = {
        t: AttemptFailed(Failure.CONNECT, f"{t} refused") for t in ("a", "b", "c", "d")
    }
    script = Script(steps, ["a", "b", "c", "d"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert response.status == 502
        body = await response.json()
    assert body["error"]["message"] == "a refused; b refused; c refused"
    assert script.opened == ["a", "b", "c"]
    assert script.released == ["a", "b", "c"]


def events(body: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[5:].strip().decode() for line in body.split(b"\n") if line.startswith(b"data:")]


async def test_a_failure_after_the_first_byte_sends_the_stream_openais_error_event(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Scripted(headers=SSE, chunks=(b"data: 1\n\n", UpstreamError("worker died")))
    script = Script({"a": stream, "b": Scripted()}, ["a", "b"])
    session, url = await serve(script)
    with caplog.at_level(logging.DEBUG, logger="gtm.relay"):
        async with session.post(url, json={}) as response:
            assert response.status == 200
            body = await response.read()  # a clean end: the error event says it all
    first, last = events(body)
    assert first == "1"
    error = json.loads(last)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error"
    assert error["code"] == "upstream_reset"
    assert "incomplete" in error["message"]
    assert b"[DONE]" not in body
    assert script.opened == ["a"]  # never retried after the first byte
    assert script.finished == [("a", Ending.CUT_RESET)]
    assert stream.closed
    assert script.released == ["a"]
    assert script.breaks(BreakCause.UPSTREAM_RESET) == 1
    assert script.breaks(BreakCause.CLIENT_DISCONNECT) == 0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "upstream_reset" in warnings[0].getMessage()
    assert "worker died" in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # one line, no traceback


async def test_a_break_inside_an_event_ends_it_before_the_error_event(serve: Serve) -> None:
    stream = Scripted(headers=SSE, chunks=(b'data: {"a": 1}\n\ndata: {"b"', OSError("reset")))
    script = Script({"a": stream}, ["a"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        body = await response.read()
    assert body.startswith(b'data: {"a": 1}\n\ndata: {"b"\n\ndata: {"error"')
    assert json.loads(events(body)[-1])["error"]["code"] == "upstream_reset"


async def test_an_upstream_silent_mid_stream_is_an_upstream_timeout(serve: Serve) -> None:
    stream = Scripted(headers=SSE, chunks=(b"data: 1\n\n", TimeoutError()))
    script = Script({"a": stream}, ["a"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        body = await response.read()
    assert json.loads(events(body)[-1])["error"]["code"] == "upstream_timeout"
    assert script.finished == [("a", Ending.CUT_TIMEOUT)]
    assert script.breaks(BreakCause.UPSTREAM_TIMEOUT) == 1


async def test_a_body_that_is_no_event_stream_is_cut_by_a_reset(serve: Serve) -> None:
    # A clean end would make a truncated JSON body look whole: the client must see a
    # short body instead (no last chunk, or fewer bytes than its Content-Length).
    chunked = Scripted(chunks=(b'{"id": "x", ', UpstreamError("worker died")))
    sized = Scripted(chunks=(b'{"id": "x", ', UpstreamError("worker died")), content_length=40)
    for upstream in (chunked, sized):
        script = Script({"a": upstream, "b": Scripted()}, ["a", "b"])
        session, url = await serve(script)
        async with session.post(url, json={}) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
        assert script.opened == ["a"]
        assert script.finished == [("a", Ending.CUT_RESET)]
        assert script.breaks(BreakCause.UPSTREAM_RESET) == 1


async def test_a_break_after_done_ends_cleanly_and_is_no_warning(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Scripted(headers=SSE, chunks=(b"data: 1\n\n", b"data: [DONE]\n\n", OSError()))
    script = Script({"a": stream}, ["a"])
    session, url = await serve(script)
    with caplog.at_level(logging.DEBUG, logger="gtm.relay"):
        async with session.post(url, json={}) as response:
            body = await response.read()
    assert events(body) == ["1", "[DONE]"]  # the whole answer, and no error after it
    assert script.finished == [("a", Ending.CUT_AFTER_DONE)]
    assert script.breaks(BreakCause.AFTER_DONE) == 1
    assert script.breaks(BreakCause.UPSTREAM_RESET) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_client_that_leaves_mid_stream_is_counted_apart_and_no_warning(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Scripted(headers=SSE, chunks=(b"data: 1\n\n", None))  # then silence
    script = Script({"a": stream}, ["a"])
    session, url = await serve(script)
    with caplog.at_level(logging.DEBUG, logger="gtm.relay"):
        async with session.post(url, json={}) as response:
            assert await response.content.readline() == b"data: 1\n"
        # Leaving the block before the body's end closes the connection.
        await asyncio.wait_for(script.ended.wait(), 10.0)
    assert script.finished == [("a", Ending.CLIENT_GONE)]
    assert stream.closed  # the upstream sees the client go
    assert script.released == ["a"]
    assert script.breaks(BreakCause.CLIENT_DISCONNECT) == 1
    assert script.breaks(BreakCause.UPSTREAM_RESET) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_reset_before_the_first_byte_is_retried(serve: Serve) -> None:
    silent = Scripted(chunks=(ConnectionResetError("reset"),))
    script = Script({"a": silent, "b": Scripted(chunks=(b"fine",))}, ["a", "b"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert await response.read() == b"fine"
    assert script.failed == [("a", "reset")]


async def test_a_missed_first_byte_deadline_is_a_timeout_attempt(serve: Serve) -> None:
    silent = Scripted(chunks=(None,))
    script = Script({"a": silent, "b": Scripted(chunks=(None,))}, ["a", "b"], deadline_passed=True)
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert response.status == 502
        assert "in time" in (await response.json())["error"]["message"]
    assert script.failed == [("a", "timeout"), ("b", "timeout")]
    assert silent.closed


async def test_hop_by_hop_headers_never_reach_the_client(serve: Serve) -> None:
    headers = {
        "Connection": "close, X-Private",
        "Keep-Alive": "timeout=5",
        "Trailers": "x-checksum",
        "X-Private": "hop",
        "X-Upstream": "kept",
    }
    script = Script({"a": Scripted(headers=CIMultiDict(headers), chunks=(b"x",))}, ["a"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        await response.read()
        assert response.headers["X-Upstream"] == "kept"
        for name in ("Keep-Alive", "Trailers", "X-Private"):
            assert name not in response.headers


async def test_a_whole_body_in_one_read_is_one_response_with_its_length(serve: Serve) -> None:
    whole = Scripted(chunks=(b"0123456789",), content_length=10)
    script = Script({"a": whole}, ["a"])
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert response.headers["Content-Length"] == "10"
        assert await response.read() == b"0123456789"
    assert whole.released
    assert script.finished == [("a", Ending.COMPLETED)]


async def test_a_tier_that_keeps_4xx_final_passes_a_429_through(serve: Serve) -> None:
    quota = Scripted(status=429, chunks=(b'{"error":"quota"}',), reason="Too Many Requests")
    script = Script({"a": quota, "b": Scripted()}, ["a", "b"], retry_4xx=False)
    session, url = await serve(script)
    async with session.post(url, json={}) as response:
        assert response.status == 429
        assert await response.read() == b'{"error":"quota"}'
    assert script.opened == ["a"]

"""The lean HTTP/1.1 server (gtm.http1) under hostile input, on real loopback sockets:
RFC 9112 §6.3 (message body length) and §11.2 (request smuggling). Each case is sent as
raw bytes to the lean listener and, where the answer is a refusal, to an aiohttp-only
listener too: both must answer alike, the connection must not desync (a request
smuggled behind a refused one is never answered), and a handler never runs with a body
other than the one the framing says."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from gtm.http1 import PIPELINE_BYTES, Fallback, LeanFront
from tests.unit.gtm.test_http1 import (
    ECHO,
    HANG,
    LIMITS,
    WAIT_S,
    Run,
    Served,
    _post,
    _raw,
    _responses,
    run,  # noqa: F401 (the fixture: each case on asyncio's loop and on uvloop)
    serving,
)

#: Behind every refused request: if it is ever answered, the connection desynced.
SMUGGLED = _post(ECHO, b'{"smuggled": 1}')
HOST = b"Host: t\r\n"


def _head(fields: bytes, body: bytes = b"{}", line: bytes = b"POST /v1/echo HTTP/1.1") -> bytes:
    return line + b"\r\n" + HOST + fields + b"\r\n" + body


def _status_and_body(response: bytes) -> tuple[bytes, bytes]:
    """A connection's one response (its status line and body): anything after the body
    its Content-Length frames (a second response) fails the test."""
    head, _, body = response.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert len(body) == length, response
    return head.split(b"\r\n", 1)[0], body


def _front(served: Served) -> LeanFront:
    front = served.server._lean
    assert front is not None
    return front


class _Pausing:
    """A connection's transport that tells when the server pauses reading it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.paused = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def pause_reading(self) -> None:
        self.paused.set()
        self._transport.pause_reading()


def _on_fallback(front: LeanFront) -> asyncio.Event:
    """Set when ``front`` hands a connection to aiohttp."""
    event = asyncio.Event()
    fell_back = front.fell_back

    def tell(reason: Fallback) -> None:
        fell_back(reason)
        event.set()

    front.fell_back = tell  # type: ignore[method-assign]
    return event


#: Framing and head syntax the lean server must not serve: aiohttp answers 400 (and
#: closes), as it does for the same bytes without the lean server.
REFUSED = {
    "content-length with transfer-encoding": _head(
        b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"
    ),
    "transfer-encoding with content-length": _head(
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"0\r\n\r\n"
    ),
    "two equal content-lengths": _head(b"Content-Length: 2\r\nContent-Length: 2\r\n"),
    "two different content-lengths": _head(b"Content-Length: 2\r\nContent-Length: 17\r\n"),
    "a content-length list": _head(b"Content-Length: 2, 2\r\n"),
    "a negative content-length": _head(b"Content-Length: -2\r\n"),
    "a signed content-length": _head(b"Content-Length: +2\r\n"),
    "a hex content-length": _head(b"Content-Length: 0x2\r\n"),
    "an overflowing content-length": _head(b"Content-Length: 99999999999999999999\r\n"),
    "transfer-encoding chunked, identity": _head(
        b"Transfer-Encoding: chunked, identity\r\n", b"0\r\n\r\n"
    ),
    "transfer-encoding xchunked": _head(b"Transfer-Encoding: xchunked\r\n", b"0\r\n\r\n"),
    "an obs-fold": _head(b"Content-Length: 2\r\nX-A: a\r\n b\r\n"),
    "a content-length hidden in an obs-fold": _head(b"X-A: a\r\n Content-Length: 2\r\n"),
    "a space before the colon": _head(b"Content-Length : 2\r\n"),
    "a NUL in a value": _head(b"Content-Length: 2\r\nX-A: a\x00b\r\n"),
    "a CR in a value": _head(b"Content-Length: 2\r\nX-A: a\rb\r\n"),
    "bare LF line ends": b"POST /v1/echo HTTP/1.1\nHost: t\nContent-Length: 2\n\n{}",
    "a bare LF ending the head": _head(b"Content-Length: 2\r\n")[:-4] + b"\n{}",
    "a bare LF inside the head": b"POST /v1/echo HTTP/1.1\r\nHost: t\nContent-Length: 2\r\n\r\n{}",
    "an asterisk-form target": _head(b"Content-Length: 2\r\n", line=b"POST * HTTP/1.1"),
    "a target over aiohttp's line limit": _head(
        b"Content-Length: 2\r\n", line=b"POST /v1/echo?" + b"q" * 8200 + b" HTTP/1.1"
    ),
    "more fields than aiohttp's parser takes": _head(
        b"Content-Length: 2\r\n"
        + b"".join(b"x-h%d: v\r\n" % i for i in range(2 * LIMITS.max_headers))
    ),
    "a field over aiohttp's field size": _head(
        b"Content-Length: 2\r\nX-A: " + b"a" * 40000 + b"\r\n"
    ),
    "a field name over aiohttp's field size": _head(
        b"Content-Length: 2\r\n" + b"a" * 32768 + b": v\r\n"
    ),
}  # fmt: skip


async def _a_refused_request_is_refused_alike_and_never_desyncs(request_bytes: bytes) -> None:
    async with serving(lean=False) as plain:
        expected = await _raw(plain, request_bytes + SMUGGLED)
    async with serving() as served:
        got = await _raw(served, request_bytes + SMUGGLED)  # until the server closes
        assert served.counted == []  # no lean handler ran
    assert _status_and_body(got) == _status_and_body(expected)
    # One response, a 400: the smuggled request was never answered.
    assert _status_and_body(got)[0].split(b" ")[1] == b"400"


@pytest.mark.parametrize("request_bytes", list(REFUSED.values()), ids=list(REFUSED))
def test_a_refused_request_is_refused_alike_and_never_desyncs(
    run: Run,  # noqa: F811
    request_bytes: bytes,
) -> None:
    run(_a_refused_request_is_refused_alike_and_never_desyncs(request_bytes))


#: What aiohttp serves itself (the lean server hands the connection over): the answer is
#: aiohttp's, whichever listener gets the bytes.
HANDED_OVER = {
    "a capitalised Chunked": (
        _head(b"Transfer-Encoding: Chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n"), Fallback.CHUNKED
    ),
    "HTTP/0.9": (b"POST /v1/echo\r\n\r\n", Fallback.VERSION),
    "HTTP/2.0": (_head(b"Content-Length: 2\r\n", line=b"POST /v1/echo HTTP/2.0"),
                 Fallback.VERSION),
    "an absolute-form target": (
        _head(b"Content-Length: 2\r\n", line=b"POST http://t/v1/echo HTTP/1.1"), Fallback.ROUTE
    ),
    "a %2e%2e path": (
        _head(b"Content-Length: 2\r\n", line=b"POST /v1/%2e%2e/v1/echo HTTP/1.1"),
        Fallback.TARGET,
    ),
    "a dot-dot path": (
        _head(b"Content-Length: 2\r\n", line=b"POST /x/../v1/echo HTTP/1.1"), Fallback.ROUTE
    ),
    "a fragment": (
        _head(b"Content-Length: 2\r\n", line=b"POST /v1/echo#top HTTP/1.1"), Fallback.ROUTE
    ),
}  # fmt: skip


async def _what_aiohttp_serves_is_answered_alike(request_bytes: bytes, reason: Fallback) -> None:
    close = b"Connection: close\r\n"
    request_bytes = request_bytes.replace(HOST, HOST + close, 1)
    async with serving(lean=False) as plain:
        expected = await _raw(plain, request_bytes)
    async with serving() as served:
        got = await _raw(served, request_bytes)
        assert served.fallbacks(reason) == 1
    assert _status_and_body(got) == _status_and_body(expected)
    assert b"Server: Python" in got  # aiohttp's answer


@pytest.mark.parametrize(
    ("request_bytes", "reason"), list(HANDED_OVER.values()), ids=list(HANDED_OVER)
)
def test_what_aiohttp_serves_is_answered_alike(
    run: Run,  # noqa: F811
    request_bytes: bytes,
    reason: Fallback,
) -> None:
    run(_what_aiohttp_serves_is_answered_alike(request_bytes, reason))


async def _lenient_but_unambiguous_heads_are_served_with_their_exact_body() -> None:
    cases = [
        _head(b"Content-Length:  2 \r\n"),  # OWS around the value (RFC 9110 §5.5)
        _head(b"Content-Length: 2\r\n", line=b"POST  /v1/echo HTTP/1.1"),
        _head(b"Content-Length: 2\r\n", line=b"POST /v1/echo  HTTP/1.1"),
    ]
    async with serving() as served:
        for request_bytes in cases:
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(request_bytes + _post(ECHO, b'{"next": 1}'))
            got = await _responses(reader, 2)
            writer.close()
            assert got == [(200, b"{}"), (200, b'{"next": 1}')], request_bytes
        assert all(served.fallbacks(r) == 0 for r in Fallback)


def test_lenient_but_unambiguous_heads_are_served_with_their_exact_body(run: Run) -> None:  # noqa: F811
    run(_lenient_but_unambiguous_heads_are_served_with_their_exact_body())


async def _a_short_body_then_a_half_close_never_reaches_the_handler() -> None:
    request_bytes = _post(HANG, b'{"a": 1234567}')[:-5]
    for lean in (False, True):
        async with serving(lean=lean) as served:
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(request_bytes)
            writer.write_eof()
            async with asyncio.timeout(WAIT_S):
                got = await reader.read()
            writer.close()
            assert got == b"", lean  # no answer, the connection ends
            assert not served.hanging.is_set()
            assert served.counted == []


def test_a_short_body_then_a_half_close_never_reaches_the_handler(run: Run) -> None:  # noqa: F811
    run(_a_short_body_then_a_half_close_never_reaches_the_handler())


async def _bytes_past_the_content_length_are_the_next_request() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(ECHO, b"{}") + _post(ECHO, b'{"n": 2}') + _post(ECHO, b"[]"))
        assert await _responses(reader, 3) == [(200, b"{}"), (200, b'{"n": 2}'), (200, b"[]")]
        # Excess that is no request: the body stays exact, the excess gets aiohttp's 400.
        writer.write(_post(ECHO, b"{}") + b"XX garbage\r\n\r\n")
        async with asyncio.timeout(WAIT_S):
            rest = await reader.read()
        writer.close()
        first, _, second = rest.partition(b"{}")
        assert first.startswith(b"HTTP/1.1 200 ")
        assert b"Content-Length: 2\r\n" in first
        assert second.startswith(b"HTTP/1.0 400 ")
        assert served.counted == [(ECHO, 200)] * 4
        assert served.fallbacks(Fallback.MALFORMED) == 1


def test_bytes_past_the_content_length_are_the_next_request(run: Run) -> None:  # noqa: F811
    run(_bytes_past_the_content_length_are_the_next_request())


async def _connection_close_semantics() -> None:
    async with serving() as served:
        # HTTP/1.0 without keep-alive, HTTP/1.1 with Connection: close: one answer, then
        # the server closes (the pipelined request behind is not answered).
        for request_bytes in (
            _post(ECHO, b"{}", version="1.0"),
            _post(ECHO, b"{}", "Connection: close"),
        ):
            got = await _raw(served, request_bytes + SMUGGLED)
            assert _status_and_body(got)[1] == b"{}"  # one response, then the end
            assert b"\r\nConnection: close\r\n" in got
        # HTTP/1.0 asking for keep-alive keeps the connection.
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(ECHO, b"{}", "Connection: keep-alive", version="1.0") + SMUGGLED)
        async with asyncio.timeout(WAIT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        assert b"\r\nConnection: keep-alive\r\n" in head
        assert await reader.readexactly(2) == b"{}"
        assert await _responses(reader, 1) == [(200, b'{"smuggled": 1}')]
        writer.close()


def test_connection_close_semantics(run: Run) -> None:  # noqa: F811
    run(_connection_close_semantics())


async def _a_pipelined_flood_is_read_no_further_than_the_bound() -> None:
    count = 12000
    flood = b"".join(_post(ECHO, b'{"n": %d}' % i) for i in range(count))
    assert len(flood) > 4 * PIPELINE_BYTES
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_post(HANG, b"{}") + flood)
        async with asyncio.timeout(WAIT_S):
            await served.hanging.wait()
            (conn,) = _front(served)._connections
            if conn._reading:  # not paused yet: wait until it is
                assert conn._transport is not None
                pausing = _Pausing(conn._transport)
                conn._transport = cast(asyncio.Transport, pausing)
                await pausing.paused.wait()
        # Bounded: the bound plus at most one read's worth, never the whole flood.
        assert len(conn._buffer) < PIPELINE_BYTES + 256 * 1024 < len(flood)
        served.release.set()
        got = await _responses(reader, count + 1)
        writer.close()
    assert got[0] == (200, b"{}")
    assert [json.loads(body)["n"] for _, body in got[1:]] == list(range(count))


def test_a_pipelined_flood_is_read_no_further_than_the_bound(run: Run) -> None:  # noqa: F811
    run(_a_pipelined_flood_is_read_no_further_than_the_bound())


async def _a_head_in_one_byte_writes_is_served() -> None:
    request_bytes = _post(ECHO, b'{"split": true}', "X-Pad: " + "p" * 300)
    async with serving() as served:
        reader, writer = await asyncio.open_connection(served.host, served.port)
        for i in range(len(request_bytes)):
            writer.write(request_bytes[i : i + 1])
            await writer.drain()
        assert await _responses(reader, 1) == [(200, b'{"split": true}')]
        writer.close()
        assert all(served.fallbacks(r) == 0 for r in Fallback)


def test_a_head_in_one_byte_writes_is_served(run: Run) -> None:  # noqa: F811
    run(_a_head_in_one_byte_writes_is_served())


def _unfinished_head(size: int) -> bytes:
    """A head of ``size`` bytes without its end: fields under every per-line and count
    limit, over the total (so a finished one is 431 on both servers)."""
    start = b"POST /v1/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
    fields, left, i = [start], size - len(start), 0
    while left > 0:
        line = min(left, 4000)
        assert line >= 12
        fields.append(b"x-f%02d: " % i + b"v" * (line - 9) + b"\r\n")
        left, i = left - line, i + 1
    head = b"".join(fields)
    assert len(head) == size
    return head


async def _a_head_at_and_over_the_bound() -> None:
    limits = LIMITS
    bound = limits.max_header_bytes + limits.max_header_line_bytes
    async with serving() as served:
        # At the bound, unfinished: the lean server keeps waiting, then its header
        # timer closes the connection unanswered.
        got = await _raw(served, _unfinished_head(bound))
        assert got == b""
        assert served.fallbacks(Fallback.HEAD_TOO_LARGE) == 0
        # One byte over: handed to aiohttp, which answers the finished head's 431.
        handed = _on_fallback(_front(served))
        reader, writer = await asyncio.open_connection(served.host, served.port)
        writer.write(_unfinished_head(bound + 1))
        async with asyncio.timeout(WAIT_S):
            await handed.wait()
        assert served.fallbacks(Fallback.HEAD_TOO_LARGE) == 1
        writer.write(b"\r\n{}")
        async with asyncio.timeout(WAIT_S):
            over = await reader.read()
        writer.close()
        # The same bytes in one write: the lean server parses and answers alike.
        alike = await _raw(served, _unfinished_head(bound + 1) + b"\r\n{}")
    status, body = _status_and_body(over)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert _status_and_body(alike) == (status, body)


def test_a_head_at_and_over_the_bound(run: Run) -> None:  # noqa: F811
    run(_a_head_at_and_over_the_bound())


async def _a_refusal_before_the_body_is_read_reaches_the_client() -> None:
    # The body is far past what the server reads before refusing: closing with it unread
    # would reset the connection and could destroy the 413 before the client reads it.
    request_bytes = _post(ECHO, b"x" * (4 << 20))
    for lean in (False, True):
        async with serving(lean=lean) as served:
            got = await _raw(served, request_bytes)
            assert served.counted == []
        status, body = _status_and_body(got)
        assert status == b"HTTP/1.1 413 Request Entity Too Large", lean
        assert json.loads(body)["error"]["code"] == "body_too_large"


def test_a_refusal_before_the_body_is_read_reaches_the_client(run: Run) -> None:  # noqa: F811
    run(_a_refusal_before_the_body_is_read_reaches_the_client())

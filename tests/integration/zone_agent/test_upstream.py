"""The data path's HTTP/1.1 client against scripted servers on loopback: framing (length,
chunked, until close), keep-alive reuse, limits, timeouts and every way a worker fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from zone_agent import upstream
from zone_agent.upstream import (
    HIGH_WATER,
    RESPONSE_HEADS_KEPT,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamPool,
    UpstreamProtocolError,
    UpstreamRefused,
    UpstreamResponse,
)

Reply = bytes | Callable[[asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Scripted:
    """Answers each request with the next scripted reply; records requests and connections."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = asyncio.Event()
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                reply = self.replies.pop(0)
                if isinstance(reply, bytes):
                    writer.write(reply)
                    await writer.drain()
                else:
                    await reply(writer)
                    if writer.is_closing():
                        return
            await reader.read()  # until the client closes
        finally:
            self.closed.set()
            writer.close()


@asynccontextmanager
async def serve(script: Scripted) -> AsyncIterator[Scripted]:
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    script.url = f"http://127.0.0.1:{port}"
    try:
        yield script
    finally:
        server.close()


async def read_all(response: UpstreamResponse) -> bytes:
    out = bytearray()
    while chunk := await response.readany():
        out += chunk
    return bytes(out)


async def body_of(pool: UpstreamPool, url: str, payload: bytes = b"{}") -> tuple[int, bytes]:
    response = await pool.post(url, "/v1/chat/completions", [], payload)
    body = await read_all(response)
    response.release()
    return response.status, body


async def test_a_length_framed_response_and_keep_alive_reuse() -> None:
    pool = UpstreamPool()
    async with serve(Scripted(OK, OK)) as server:
        assert await body_of(pool, server.url) == (200, b"{}")
        assert await body_of(pool, server.url) == (200, b"{}")
        assert server.connections == 1  # the second request reused the first connection
        head = server.requests[0].split(b"\r\n\r\n")[0].decode()
        assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: {server.url.removeprefix('http://')}" in head
        assert "Content-Length: 2" in head
    await pool.close()


async def test_a_response_read_whole_with_its_head_needs_no_wait() -> None:
    pool = UpstreamPool()
    async with serve(Scripted(OK)) as server:  # head and body in one write
        response = await pool.post(server.url, "/v1/chat/completions", [], b"{}")
        assert response.body == b"{}"  # offered whole: the relay answers it without a read
        # Its body arrived with the head: each read returns without suspending.
        for expected in (b"{}", b""):
            read = response.readany()
            with pytest.raises(StopIteration) as done:
                read.send(None)
            assert done.value.value == expected
        response.release()
    await pool.close()


@pytest.mark.parametrize(
    ("status_line", "status", "reason", "reused"),
    [
        (b"HTTP/1.1 200 OK", 200, "OK", True),
        (b"HTTP/1.1 200 OKAY", 200, "OKAY", True),
        (b"HTTP/1.1 200 ", 200, "", True),
        (b"HTTP/1.0 200 OK", 200, "OK", False),
        (b"HTTP/1.1 404 Not Found", 404, "Not Found", True),
    ],
)
async def test_status_lines(status_line: bytes, status: int, reason: str, reused: bool) -> None:
    reply = status_line + b"\r\nContent-Length: 2\r\n\r\n{}"
    pool = UpstreamPool()
    async with serve(Scripted(reply, reply)) as server:
        response = await pool.post(server.url, "/v1/chat/completions", [], b"{}")
        assert (response.status, response.reason) == (status, reason)
        assert response.headers["content-length"] == "2"
        assert await read_all(response) == b"{}"
        response.release()
        await body_of(pool, server.url)
        assert server.connections == (1 if reused else 2)
    await pool.close()


async def test_each_path_gets_its_own_request_line() -> None:
    paths = [f"/v1/p{i}" for i in range(20)]  # more than the heads a worker keeps
    pool = UpstreamPool()
    async with serve(Scripted(*[OK] * (2 * len(paths)))) as server:
        for path in paths * 2:
            response = await pool.post(server.url, path, [], b"{}")
            await read_all(response)
            response.release()
        host = server.url.removeprefix("http://")
        expected = [f"POST {path} HTTP/1.1\r\nHost: {host}\r\n" for path in paths * 2]
        assert [r.decode().split("Content-Length")[0] for r in server.requests] == expected
    await pool.close()


async def test_headers_go_upstream_and_come_back() -> None:
    pool = UpstreamPool()
    reply = b"HTTP/1.1 201 Created\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n"
    async with serve(Scripted(reply)) as server:
        response = await pool.post(
            server.url,
            "/v1/completions",
            [("x-request-id", "r-1"), ("Authorization", "Bearer t"), ("x-evil", "a\r\nb: c")],
            b"",
        )
        assert (response.status, response.reason) == (201, "Created")
        assert response.headers.getall("x-a") == ["1", "2"]
        assert response.content_length == 0
        assert await response.readany() == b""
        response.release()
        head = server.requests[0].decode()
        assert "x-request-id: r-1\r\n" in head
        assert "Authorization: Bearer t\r\n" in head
        assert "x-evil" not in head  # a header with CR/LF cannot be sent as one header
    await pool.close()


async def test_chunked_body_arriving_a_byte_at_a_time() -> None:
    body = b"data: 1\n\n" * 20
    chunked = b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7])
        for i in range(0, len(body), 7)
    )
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\nX-T: 1\r\n\r\n"
    )

    async def trickle(writer: asyncio.StreamWriter) -> None:
        for i in range(len(raw)):
            writer.write(raw[i : i + 1])
            await writer.drain()

    pool = UpstreamPool()
    async with serve(Scripted(trickle, OK)) as server:
        assert await body_of(pool, server.url) == (200, body)
        assert await body_of(pool, server.url) == (200, b"{}")
        assert server.connections == 1  # a chunked body read to its end keeps the connection
    await pool.close()


async def test_a_body_not_whole_with_its_head_is_not_offered_whole() -> None:
    head_read = asyncio.Event()

    async def split(writer: asyncio.StreamWriter) -> None:
        writer.write(OK[:-1])  # the head and part of the body; the rest once the head is read
        await writer.drain()
        await head_read.wait()
        writer.write(OK[-1:])
        await writer.drain()

    pool = UpstreamPool()
    async with serve(Scripted(split)) as server:
        response = await pool.post(server.url, "/v1/chat/completions", [], b"{}")
        assert response.body is None
        head_read.set()
        assert await read_all(response) == b"{}"
        response.release()
    await pool.close()


async def test_interim_responses_are_skipped() -> None:
    pool = UpstreamPool()
    async with serve(Scripted(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)) as server:
        assert await body_of(pool, server.url) == (200, b"{}")
    await pool.close()


async def test_a_body_until_close_is_read_and_the_connection_not_reused() -> None:
    async def until_close(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    pool = UpstreamPool()
    async with serve(Scripted(until_close, OK)) as server:
        assert await body_of(pool, server.url) == (200, b"all of it")
        assert await body_of(pool, server.url) == (200, b"{}")
        assert server.connections == 2
    await pool.close()


async def test_connection_close_is_honoured() -> None:
    reply = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    pool = UpstreamPool()
    async with serve(Scripted(reply, OK)) as server:
        await body_of(pool, server.url)
        await body_of(pool, server.url)
        assert server.connections == 2
    await pool.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\nb\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\r\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n: a\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n",
    ],
)
async def test_garbage_heads_are_protocol_errors(garbage: bytes) -> None:
    pool = UpstreamPool()
    async with serve(Scripted(garbage)) as server:
        with pytest.raises(UpstreamProtocolError):
            await pool.post(server.url, "/v1/completions", [], b"{}")
        await asyncio.wait_for(server.closed.wait(), 5.0)  # the connection was dropped
    assert pool.open_connections == 0
    await pool.close()


@pytest.mark.parametrize(
    "body", [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabXX0\r\n\r\n", b"0x2\r\nab\r\n0\r\n\r\n"]
)
async def test_a_bad_chunked_body_fails_the_read(body: bytes) -> None:
    pool = UpstreamPool()
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    async with serve(Scripted(reply)) as server:
        response = await pool.post(server.url, "/v1/completions", [], b"{}")
        with pytest.raises(UpstreamProtocolError):
            await read_all(response)
        response.close()
    await pool.close()


async def test_a_worker_closing_mid_body_fails_the_read() -> None:
    async def cut(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    pool = UpstreamPool()
    async with serve(Scripted(cut)) as server:
        response = await pool.post(server.url, "/v1/completions", [], b"{}")
        assert await response.readany() == b"partial"
        with pytest.raises(UpstreamClosed):
            await response.readany()
        response.close()
    await pool.close()


async def test_a_worker_closing_before_the_head_fails_the_post() -> None:
    async def hang_up(writer: asyncio.StreamWriter) -> None:
        writer.close()

    pool = UpstreamPool()
    async with serve(Scripted(hang_up)) as server:
        with pytest.raises(UpstreamClosed):
            await pool.post(server.url, "/v1/completions", [], b"{}")
    await pool.close()


async def test_connect_failure_carries_the_os_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = UpstreamPool()
    with pytest.raises(UpstreamConnectError) as caught:
        await pool.post(f"http://127.0.0.1:{port}", "/v1/completions", [], b"{}")
    assert isinstance(caught.value.os_error, ConnectionRefusedError)
    await pool.close()


async def test_a_silent_worker_times_out() -> None:
    async def silent(writer: asyncio.StreamWriter) -> None:
        return None  # reads the request, never answers

    pool = UpstreamPool(read_timeout_s=0.2)
    async with serve(Scripted(silent)) as server:
        with pytest.raises(TimeoutError):
            await pool.post(server.url, "/v1/completions", [], b"{}")
        await asyncio.wait_for(server.closed.wait(), 5.0)  # the request was abandoned
    await pool.close()


async def test_plaintext_is_refused_when_tls_is_required() -> None:
    pool = UpstreamPool(refuse_plain=True)
    with pytest.raises(UpstreamRefused, match="no plaintext fallback"):
        await pool.post("http://127.0.0.1:9", "/v1/completions", [], b"{}")
    await pool.close()


async def test_per_worker_limit_makes_the_next_request_wait() -> None:
    pool = UpstreamPool(per_worker=1)
    async with serve(Scripted(OK, OK)) as server:
        first = await pool.post(server.url, "/v1/completions", [], b"{}")
        async with asyncio.TaskGroup() as group:
            second = group.create_task(pool.post(server.url, "/v1/completions", [], b"{}"))
            await asyncio.sleep(0)  # let it start: it must wait for the one connection
            await asyncio.sleep(0)
            assert not second.done()
            assert await first.readany() == b"{}"
            first.release()
        response = second.result()
        assert await response.readany() == b"{}"
        response.release()
        assert server.connections == 1
    await pool.close()


async def test_a_cancelled_wait_for_a_connection_hands_it_on() -> None:
    pool = UpstreamPool(per_worker=1)
    async with serve(Scripted(OK, OK, OK)) as server:
        first = await pool.post(server.url, "/v1/completions", [], b"{}")
        async with asyncio.TaskGroup() as group:
            second = group.create_task(pool.post(server.url, "/v1/completions", [], b"{}"))
            third = group.create_task(pool.post(server.url, "/v1/completions", [], b"{}"))
            await asyncio.sleep(0)  # both wait for the one connection
            second.cancel()
            assert await first.readany() == b"{}"
            first.release()  # to the third: the cancelled second holds nothing
        response = third.result()
        assert await read_all(response) == b"{}"
        response.release()
        assert second.cancelled()
        assert server.connections == 1
        # The connection is free again: a fourth request does not wait.
        assert await asyncio.wait_for(body_of(pool, server.url), 5.0) == (200, b"{}")
    await pool.close()


async def test_idle_connections_expire() -> None:
    now = [0.0]
    pool = UpstreamPool(idle_s=4.0, monotonic=lambda: now[0])
    async with serve(Scripted(OK, OK, OK)) as server:
        await body_of(pool, server.url)
        now[0] = 3.0
        await body_of(pool, server.url)
        assert server.connections == 1
        now[0] = 7.5  # idle longer than idle_s: a new connection
        await body_of(pool, server.url)
        assert server.connections == 2
    await pool.close()


async def test_close_aborts_an_unfinished_response() -> None:
    async def stream(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()

    pool = UpstreamPool()
    async with serve(Scripted(stream)) as server:
        response = await pool.post(server.url, "/v1/completions", [], b"{}")
        assert await response.readany() == b"abc"
        response.close()
        await asyncio.wait_for(server.closed.wait(), 5.0)  # the worker sees it go away
    assert pool.open_connections == 0
    await pool.close()


async def test_a_body_larger_than_the_buffer_bound_arrives_whole() -> None:
    body = bytes(range(256)) * (4 * HIGH_WATER // 256)
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    pool = UpstreamPool()
    async with serve(Scripted(reply)) as server:
        response = await pool.post(server.url, "/v1/completions", [], b"{}")
        assert await read_all(response) == body
        response.release()
    await pool.close()


# ---------------------------------------------------------------- GET (the scrapes)


async def test_a_get_has_no_body_reads_the_whole_answer_and_keeps_the_connection() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\n# a \r\n6\r\nmetric\r\n0\r\n\r\n"
    )
    async with serve(Scripted(OK, chunked)) as worker:
        pool = UpstreamPool()
        try:
            assert await pool.get(worker.url, "/metrics", limit=1024) == (200, b"{}")
            assert await pool.get(worker.url, "/metrics", limit=1024) == (200, b"# a metric")
        finally:
            await pool.close()
    assert worker.connections == 1  # kept alive between the two
    for request in worker.requests:
        head = request.decode()
        assert head.startswith("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
        assert "content-length" not in head.lower()
        assert head.endswith("\r\n\r\n")  # and nothing after: no body


async def test_a_get_answer_past_the_limit_is_cut_and_its_connection_closed() -> None:
    long = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
    async with serve(Scripted(long, OK)) as worker:
        pool = UpstreamPool()
        try:
            status, body = await pool.get(worker.url, "/metrics", limit=10)
            assert status == 200
            assert len(body) > 10  # the caller refuses it for its length
            assert await pool.get(worker.url, "/metrics", limit=10) == (200, b"{}")
        finally:
            await pool.close()
    assert worker.connections == 2  # the cut one was not reused


async def test_a_get_of_a_failing_worker_raises_as_a_post_does() -> None:
    async def cut(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    status = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"
    async with serve(Scripted(status, cut)) as worker:
        pool = UpstreamPool()
        try:
            assert await pool.get(worker.url, "/metrics", limit=1024) == (503, b"busy")
            with pytest.raises(UpstreamClosed):
                await pool.get(worker.url, "/metrics", limit=1024)
        finally:
            await pool.close()
    assert worker.connections == 1


async def test_a_head_seen_before_is_taken_from_the_pool_and_framed_anew_each_time() -> None:
    """The same response head, sent again, is not parsed again: the pool keeps its
    parse (read-only, shared by the connections). Each response still gets the head's
    framing and keep-alive: a kept ``Connection: close`` head closes every time, a kept
    chunked head frames each body, a kept length head counts each body's bytes."""
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    replies: list[Reply] = [OK, OK, chunked + b"2\r\nab\r\n0\r\n\r\n", OK]
    replies += [chunked + b"3\r\ncde\r\n0\r\n\r\n", closing, closing, OK]
    pool = UpstreamPool()
    parses: list[bytes] = []
    original = upstream.parse_head

    def counted(head: bytes) -> object:
        parses.append(head)
        return original(head)

    upstream.parse_head = counted  # type: ignore[assignment]
    try:
        async with serve(Scripted(*replies)) as server:
            first = await pool.post(server.url, "/v1/chat/completions", [], b"{}")
            assert await read_all(first) == b"{}"
            first.release()
            second = await pool.post(server.url, "/v1/chat/completions", [], b"{}")
            assert second.headers is first.headers  # one parse, shared
            with pytest.raises(TypeError):
                second.headers["X-Mine"] = "no"  # type: ignore[index]
            assert await read_all(second) == b"{}"
            second.release()
            assert await body_of(pool, server.url) == (200, b"ab")
            assert await body_of(pool, server.url) == (200, b"{}")
            assert await body_of(pool, server.url) == (200, b"cde")
            assert server.connections == 1
            for _ in range(3):
                assert await body_of(pool, server.url) == (200, b"{}")
            assert server.connections == 3  # each "Connection: close" closed its own
    finally:
        upstream.parse_head = original
    await pool.close()
    assert len(parses) == 3  # OK, the chunked head, the closing head: once each


def test_the_pool_keeps_a_bounded_number_of_heads_oldest_out_first() -> None:
    loop = asyncio.new_event_loop()
    try:
        heads: dict[bytes, upstream._Head] = {}
        conn = upstream._Connection(loop, heads)
        sent = [
            b"HTTP/1.1 200 OK\r\nContent-Length: %d" % n for n in range(RESPONSE_HEADS_KEPT + 1)
        ]
        for head in sent:
            conn._state = upstream._HEAD
            assert conn._head(head)
        assert len(heads) == RESPONSE_HEADS_KEPT
        assert sent[0] not in heads
        assert list(heads) == sent[1:]
        assert conn.content_length == RESPONSE_HEADS_KEPT
    finally:
        loop.close()

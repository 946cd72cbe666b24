"""The data path's HTTP/1.1 client: keep-alive pools to the workers on asyncio Protocols.

Why not aiohttp's ``ClientSession`` (which the agent still uses for scrapes and health
checks): on the data path its general machinery (sessions, connectors, tracing, cookie
and redirect handling) runs on every request although the proxy needs none of it, and
dominates the agent's CPU per request over a bare protocol (``bench/zone_proxy.py``
prints that CPU). It
sits behind :class:`gtm.relay.Upstream`, so the zone keeps the relay every tier uses.
The proxy needs a small part of HTTP/1.1: one POST with a body (or a GET without one:
a scrape of ``/metrics``), a status
line and headers, then a body framed by ``Content-Length``, ``chunked`` or the end of the
connection, streamed as it arrives, and keep-alive reuse of the connection (RFC 9112 §6
and §9). That part is here, and nothing else: no redirects, cookies, proxies,
compression (bodies are relayed as the worker sent them) or pipelining.

* **Pool**: idle connections per worker URL, reused last-in first-out; at most
  ``per_worker`` connections in use per worker (more requests wait for one, as
  aiohttp's ``limit_per_host``); an idle connection is dropped after ``idle_s``, below
  the 5 s keep-alive timeout of uvicorn (vLLM's and SGLang's server) so the agent never
  writes to one the worker is closing.
* **Flow control**: the worker's socket is paused while more than ``HIGH_WATER`` bytes
  of its body wait for the client, so a slow client slows the worker, not the agent's
  memory.
* **Timeouts**: ``connect_timeout_s`` for TCP (and TLS) set-up, ``read_timeout_s`` for
  any wait for bytes (aiohttp's ``sock_read``; up to a tenth of it late, see
  :class:`_Deadlines`), both as ``TimeoutError``.
* **Errors** (:class:`~zone_agent.errors.UpstreamError`): connect failures carry the ``OSError``; a
  connection that closes before its response ends and bytes that are not HTTP are
  errors of the response, never of the agent.
* **TLS**: ``https://`` workers over the given context (mutual TLS and gtm identity
  checks come with it); with ``refuse_plain`` an ``http://`` worker is refused rather
  than spoken to in plaintext.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, NamedTuple, cast

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from zone_agent.errors import (
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamRefused,
)

#: Longest response head (status line and headers) accepted, bytes (aiohttp's default
#: limits are 8 KB per line and 32 KB of fields; a worker's head is a few hundred).
MAX_HEAD = 64 * 1024

#: Longest chunk-size or trailer line, bytes.
MAX_LINE = 8 * 1024

#: Body bytes buffered for the client above which the worker's socket is paused, and
#: below which it is resumed (64 KiB: asyncio's default write buffer high-water mark).
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024

#: Idle keep-alive lifetime, s: under uvicorn's default ``timeout_keep_alive`` (5 s).
IDLE_S = 4.0

_CRLF = b"\r\n"
#: The usual status line (with its CRLF: a reason phrase "OKAY" is not it).
_OK = b"HTTP/1.1 200 OK\r\n"
#: Request heads kept per worker (the OpenAI endpoints are three paths; a bound all
#: the same, whatever paths a caller sends).
_HEADS_KEPT = 16

#: Parsed response heads a pool keeps, by their bytes (:class:`_Head`; the request heads
#: kept per worker are :data:`_HEADS_KEPT`'s): a worker sends the same head again and
#: again (a stream's differs only in its Date, once a second; a whole answer's also in
#: its Content-Length), and parsing one anew (the fields, the mapping over them, each a
#: fresh object to make and free) is a share of the agent's CPU per proxied request
#: that ``bench/zone_proxy.py`` sees (CHANGELOG). The oldest goes first past the bound.
RESPONSE_HEADS_KEPT = 256

# Parser states.
_IDLE, _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(
    9
)


class _Target:
    """A worker the pool talks to: its address, its request heads, its slots."""

    __slots__ = ("heads", "host", "host_header", "idle", "key", "port", "slots", "tls")

    def __init__(
        self, key: str, host: str, port: int, tls: bool, host_header: str, per_worker: int
    ) -> None:
        self.key = key
        self.host = host
        self.port = port
        self.tls = tls
        self.host_header = host_header
        #: The request line and Host field by path, built on the path's first request
        #: (a worker is sent a handful of paths: at most _HEADS_KEPT are kept).
        self.heads: dict[str, str] = {}
        #: Connections in use and requests waiting for one (``per_worker``).
        self.slots = _Slots(per_worker)
        #: Idle keep-alive connections, the most recently used last.
        self.idle: list[_Connection] = []

    def head(self, path: str) -> str:
        head = self.heads.get(path)
        if head is None:
            head = f"POST {path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            if len(self.heads) < _HEADS_KEPT:
                self.heads[path] = head
        return head

    def get_head(self, path: str) -> str:
        """A ``GET`` request's line and Host field (a scrape's: not kept)."""
        return f"GET {path} HTTP/1.1\r\nHost: {self.host_header}\r\n"


class _Slots:
    """At most ``limit`` connections in use to one worker; requests beyond it wait for
    one, first come first served (as ``asyncio.Semaphore``, whose ``acquire`` is a
    coroutine to await even when a connection is free, as it is for nearly every
    request: the pool takes a free one with a test, and only :meth:`wait`-s for one
    when none is free)."""

    __slots__ = ("_waiters", "free")

    def __init__(self, limit: int) -> None:
        self.free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def wait(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a slot handed over by :meth:`give`."""
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as it was cancelled: to the next one
            raise

    def give(self) -> None:
        """Give a slot back: to the first live waiter, else to the free ones."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():  # (a cancelled waiter is done)
                waiter.set_result(None)
                return
        self.free += 1


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection to a worker and the response being read on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, heads: dict[bytes, _Head]) -> None:
        self.loop = loop
        #: The pool's parsed response heads, by their bytes (:data:`RESPONSE_HEADS_KEPT`).
        self.response_heads = heads
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._state = _IDLE
        self._remaining = 0
        self._head_waiter: asyncio.Future[None] | None = None
        self._data_waiter: asyncio.Future[None] | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self._paused = False
        self.error: UpstreamError | None = None
        self.closed = False
        self.keep_alive = True
        self.idle_since = 0.0
        # The head of the response being read.
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        #: :attr:`headers`' fields in order (as read).
        self.fields: tuple[tuple[str, str], ...] = ()
        self.content_length: int | None = None
        #: The whole body, when it arrived with the head and matched its Content-Length
        #: (also in :attr:`chunks`, for a reader that reads it).
        self.body: bytes | None = None
        #: The worker (set when the pool makes the connection).
        self.target: _Target | None = None

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but quack alike.)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        state = self._state
        if state in (_IDLE, _DONE):
            # Bytes nobody asked for: the connection cannot be trusted for another request.
            self.keep_alive = False
            return
        try:
            if state == _HEAD and not self._buf:
                # The usual read: the whole head, and often the whole body after it, in
                # one ``data`` and nothing buffered before it. Parsed from ``data``
                # itself (no copy into the buffer and out again); a body that is all
                # there is becomes :attr:`body` (not paused for: nothing more comes), so
                # the response is done when its reader wakes.
                end = data.find(b"\r\n\r\n")
                if 0 <= end <= MAX_HEAD:
                    final = self._head(data[:end])
                    data = data[end + 4 :]
                    if final and self._state == _LENGTH and len(data) == self._remaining:
                        self._remaining = 0
                        self._state = _DONE
                        self.chunks.append(data)
                        self.buffered += len(data)
                        self.body = data
                        data = b""
                    if final:
                        waiter = self._head_waiter
                        if waiter is not None and not waiter.done():
                            waiter.set_result(None)
                    if not data:
                        return
            self._buf += data
            self._parse()
        except UpstreamProtocolError as exc:
            self._fail(exc)
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE  # the end of the connection is the end of this body
            self._wake()
        elif self._state not in (_IDLE, _DONE):
            detail = f": {exc}" if exc is not None else ""
            self._fail(UpstreamClosed(f"the worker closed the connection mid-response{detail}"))

    # -------------------------------------------------------------- requests

    def close(self) -> None:
        self.keep_alive = False
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def take(self) -> bytes:
        """Every body byte that arrived and was not taken yet."""
        chunks = self.chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    # -------------------------------------------------------------- parsing

    def _parse(self) -> None:
        buf = self._buf
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0 or end > MAX_HEAD:
                    if end > MAX_HEAD or len(buf) > MAX_HEAD:
                        raise UpstreamProtocolError("response head too long")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                if self._head(head):
                    waiter = self._head_waiter
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
            elif state in (_LENGTH, _CHUNK_DATA):
                if not buf:
                    return
                take = min(len(buf), self._remaining)
                self._push(bytes(buf[:take]) if take < len(buf) else bytes(buf))
                del buf[:take]
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _DONE if state == _LENGTH else _CHUNK_END
                    if state == _LENGTH:
                        self._finish()
            elif state == _CHUNK_SIZE:
                line = self._line(buf)
                if line is None:
                    return
                size_text = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise UpstreamProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                if size < 0 or size_text.startswith((b"-", b"+", b"0x", b"0X")):
                    raise UpstreamProtocolError(f"bad chunk size {size_text[:20]!r}")
                if size == 0:
                    self._state = _TRAILERS
                else:
                    self._remaining, self._state = size, _CHUNK_DATA
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != _CRLF:
                    raise UpstreamProtocolError("chunk not followed by CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                line = self._line(buf)
                if line is None:
                    return
                if not line:
                    self._state = _DONE
                    self._finish()
            elif state == _UNTIL_CLOSE:
                if buf:
                    self._push(bytes(buf))
                    buf.clear()
                return
            else:  # _DONE: bytes after the response
                if buf:
                    self.keep_alive = False
                    buf.clear()
                return

    @staticmethod
    def _line(buf: bytearray) -> bytes | None:
        end = buf.find(_CRLF)
        if end < 0:
            if len(buf) > MAX_LINE:
                raise UpstreamProtocolError("line too long in a chunked body")
            return None
        line = bytes(buf[:end])
        del buf[: end + 2]
        return line

    def _head(self, head: bytes) -> bool:
        """Take in a response head (its parse kept by the pool:
        :data:`RESPONSE_HEADS_KEPT`); False for an interim response (the real one
        follows)."""
        heads = self.response_heads
        parsed = heads.get(head)
        if parsed is None:
            parsed = parse_head(head)
            if parsed is None:
                return False
            if len(heads) >= RESPONSE_HEADS_KEPT:
                del heads[next(iter(heads))]
            heads[head] = parsed
        self.status = parsed.status
        self.reason = parsed.reason
        self.headers = parsed.headers
        self.fields = parsed.fields
        if not parsed.keep_alive:
            self.keep_alive = False
        length = self.content_length = parsed.content_length
        state = self._state = parsed.framing
        if state == _LENGTH:
            self._remaining = cast(int, length)
        return True

    def _push(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._wake()

    def _wake(self) -> None:
        waiter = self._data_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self.keep_alive = False
        for waiter in (self._head_waiter, self._data_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class _Head(NamedTuple):
    """A response head, parsed (immutable: a pool's connections share it)."""

    status: int
    reason: str
    headers: CIMultiDictProxy[str]
    fields: tuple[tuple[str, str], ...]
    #: False: the connection ends with this response (HTTP/1.0, ``Connection: close``,
    #: or a body delimited by the connection's end).
    keep_alive: bool
    content_length: int | None
    #: How the body is delimited: the parser state the body starts in.
    framing: int


def parse_head(head: bytes) -> _Head | None:
    """Parse a status line and headers (RFC 9112 §4, §5) and how the body is delimited
    (§6.3); None for an interim response (the real one follows)."""
    # Every CR and every LF must be half of a line-ending CRLF: equal counts of the
    # three say so in three scans, without a copy of the head.
    crlfs = head.count(_CRLF)
    if head.count(b"\r") != crlfs or head.count(b"\n") != crlfs or b"\0" in head:
        raise UpstreamProtocolError("stray CR, LF or NUL in the response head")
    if head.startswith(_OK):
        # The usual status line, read without splitting it.
        status, reason, http11 = 200, "OK", True
        fields = _fields(head, None)
    else:
        split = head.split(_CRLF)
        parts = split[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3:
            raise UpstreamProtocolError(f"not an HTTP/1.x status line: {split[0][:40]!r}")
        try:
            status = int(parts[1])
        except ValueError:
            raise UpstreamProtocolError(f"bad status code {parts[1]!r}") from None
        if not 100 <= status <= 599:
            raise UpstreamProtocolError(f"bad status code {status}")
        fields = _fields(head, split)
        if status < 200:
            return None  # an interim response (100 Continue, 103 Early Hints)
        reason = parts[2].decode("utf-8", "replace") if len(parts) > 2 else ""
        http11 = parts[0] == b"HTTP/1.1"
    headers = CIMultiDictProxy(CIMultiDict(fields))
    connection = headers.get("connection")
    keep_alive = http11 and (connection is None or "close" not in connection.lower())
    kept = tuple(fields)
    # How the body is delimited (RFC 9112 §6.3).
    if status == 204 or status == 304:
        return _Head(status, reason, headers, kept, keep_alive, None, _DONE)
    coding = headers.get("transfer-encoding")
    if coding is not None:
        if coding.rsplit(",", 1)[-1].strip().lower() != "chunked":
            return _Head(status, reason, headers, kept, False, None, _UNTIL_CLOSE)
        return _Head(status, reason, headers, kept, keep_alive, None, _CHUNK_SIZE)
    lengths = headers.getall("content-length", None)
    if lengths is not None:
        # Every value the same number (a set of the stripped values, one long).
        value = lengths[0].strip()
        for other in lengths[1:]:
            if other.strip() != value:
                value = ""
        if not value.isdigit():
            raise UpstreamProtocolError(f"bad Content-Length {lengths!r}")
        length = int(value)
        framing = _DONE if length == 0 else _LENGTH
        return _Head(status, reason, headers, kept, keep_alive, length, framing)
    return _Head(status, reason, headers, kept, False, None, _UNTIL_CLOSE)


#: What ``bytes.strip()`` strips (ASCII whitespace): ``str.strip()`` strips more.
_ASCII_SPACE = " \t\n\r\x0b\x0c"


def _fields(head: bytes, lines: list[bytes] | None) -> list[tuple[str, str]]:
    """The header fields of a response head split in ``lines`` (the status line first;
    None: not split yet): names decoded as ASCII, values as UTF-8 (both with
    ``surrogateescape``). A head all in ASCII (the usual one) is decoded once and split
    as text: the same fields, without a decode per name and per value."""
    if head.isascii():
        return _ascii_fields(head.decode("ascii").split("\r\n")[1:])
    return _byte_fields((head.split(_CRLF) if lines is None else lines)[1:])


def _ascii_fields(lines: list[str]) -> list[tuple[str, str]]:
    fields = []
    for line in lines:
        name, colon, value = line.partition(":")
        # (A name with space at either end: its ends tested, not a stripped copy.)
        if not colon or not name or name[0] in _ASCII_SPACE or name[-1] in _ASCII_SPACE:
            raise UpstreamProtocolError(f"bad header line {line[:40].encode()!r}")
        fields.append((name, value.strip(" \t")))
    return fields


def _byte_fields(lines: list[bytes]) -> list[tuple[str, str]]:
    fields = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise UpstreamProtocolError(f"bad header line {line[:40]!r}")
        fields.append(
            (
                name.decode("ascii", "surrogateescape"),
                value.strip(b" \t").decode("utf-8", "surrogateescape"),
            )
        )
    return fields


class _Deadlines:
    """The read timeouts of a pool's waits (a response's head, each stretch of its body),
    kept in one table that one timer sweeps, every tenth of the timeout (at most a
    second): a timer made and cancelled per wait cost a timer handle per request and per
    streamed chunk. A wait times out at most a tenth of the timeout late."""

    __slots__ = ("_loop", "_sweeping", "_tick_s", "_timeout_s", "_waits")

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._tick_s = min(1.0, timeout_s / 10)
        #: Each wait's waiter and its deadline (loop time).
        self._waits: dict[asyncio.Future[None], float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeping: asyncio.TimerHandle | None = None

    def add(self, waiter: asyncio.Future[None], loop: asyncio.AbstractEventLoop) -> None:
        """``waiter`` fails with ``TimeoutError`` once the timeout is up (unless done,
        or :meth:`discard`-ed, first)."""
        self._waits[waiter] = loop.time() + self._timeout_s
        if self._sweeping is None:
            self._loop = loop
            self._sweeping = loop.call_later(self._tick_s, self._sweep)

    def discard(self, waiter: asyncio.Future[None]) -> None:
        self._waits.pop(waiter, None)

    def _sweep(self) -> None:
        loop = self._loop
        assert loop is not None  # (set when the sweep was armed)
        now = loop.time()
        waits = self._waits
        late = [waiter for waiter, deadline in waits.items() if deadline <= now]
        for waiter in late:
            del waits[waiter]
            if not waiter.done():
                waiter.set_exception(TimeoutError())
        self._sweeping = loop.call_later(self._tick_s, self._sweep) if waits else None

    def close(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None


class UpstreamResponse:
    """A worker's response: status and headers at once, the body as it arrives.

    Call :meth:`release` after reading the whole body (the connection goes back to the
    pool) or :meth:`close` (the connection is closed, and the worker sees the client
    go away). Either may be called more than once.
    """

    __slots__ = (
        "_conn",
        "_deadlines",
        "_done",
        "_loop",
        "_on_done",
        "body",
        "content_length",
        "fields",
        "headers",
        "reason",
        "status",
    )

    def __init__(
        self,
        conn: _Connection,
        loop: asyncio.AbstractEventLoop,
        deadlines: _Deadlines,
        on_done: Callable[[_Connection, bool], None],
    ) -> None:
        self._conn = conn
        self._loop = loop
        self._deadlines = deadlines
        self._on_done = on_done
        self._done = False
        self.status: int = conn.status
        self.reason: str = conn.reason
        self.headers: CIMultiDictProxy[str] = conn.headers
        #: The headers' fields in order (:class:`gtm.relay.Upstream`).
        self.fields: tuple[tuple[str, str], ...] = conn.fields
        self.content_length: int | None = conn.content_length
        #: The whole body when it came with the head (:class:`gtm.relay.Upstream`).
        self.body: bytes | None = conn.body

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some if none
        did); ``b""`` once the body has ended."""
        conn = self._conn
        while not conn.chunks:
            if conn.error is not None:
                raise conn.error
            if conn._state == _DONE:
                return b""
            # The pool's deadline on the waiter itself, inline (as post's wait for the
            # head): ``asyncio.timeout`` costs a task cancellation and a context manager
            # per wait, a helper coroutine a frame per chunk of a stream.
            loop = self._loop
            waiter = conn._data_waiter = loop.create_future()
            deadlines = self._deadlines
            deadlines.add(waiter, loop)
            try:
                await waiter
            finally:
                deadlines.discard(waiter)
        return conn.take()

    def release(self) -> None:
        """Done with the response: reuse the connection if the body was read to its end."""
        if not self._done:
            self._done = True
            conn = self._conn
            # Reused only when the body was read to its end and nothing else came.
            self._on_done(
                conn,
                conn.keep_alive
                and not conn.closed
                and conn._state == _DONE
                and not conn._buf
                and conn.error is None,
            )

    def close(self) -> None:
        """Done with the response: close the connection (an unfinished request aborts)."""
        if not self._done:
            self._done = True
            self._on_done(self._conn, False)


class UpstreamPool:
    """Keep-alive connections to the workers, and ``POST`` over them (``GET`` for the
    scrapes, over a pool of their own)."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        refuse_plain: bool = False,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 300.0,
        per_worker: int = 256,
        idle_s: float = IDLE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_worker < 1:
            raise ValueError("per_worker must be >= 1")
        self._ssl = ssl_context
        self._refuse_plain = refuse_plain
        self._connect_timeout_s = connect_timeout_s
        self._deadlines = _Deadlines(read_timeout_s)
        self._per_worker = per_worker
        self._idle_s = idle_s
        self._monotonic = monotonic
        self._targets: dict[str, _Target] = {}
        #: Response heads parsed, shared by the pool's connections
        #: (:data:`RESPONSE_HEADS_KEPT`).
        self._response_heads: dict[bytes, _Head] = {}
        self._open: set[_Connection] = set()
        self._closed = False

    def _tls_context(self) -> ssl.SSLContext:
        """The configured context; without one, the system's default verification (as
        aiohttp's ``ssl=True``) for an ``https://`` worker."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def _target(self, base: str) -> _Target:
        target = self._targets.get(base)
        if target is None:
            url = URL(base)
            if url.scheme not in ("http", "https") or not url.host:
                raise UpstreamRefused(f"not an http(s) worker URL: {base!r}")
            port = url.port or (443 if url.scheme == "https" else 80)
            host = url.raw_host or url.host
            bracketed = f"[{host}]" if ":" in host else host
            default = port == (443 if url.scheme == "https" else 80)
            target = _Target(
                base,
                host,
                port,
                url.scheme == "https",
                bracketed if default else f"{bracketed}:{port}",
                self._per_worker,
            )
            self._targets[base] = target
        return target

    def post(
        self, base: str, path: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> Coroutine[Any, Any, UpstreamResponse]:
        """Send ``POST path`` to the worker at ``base``; the response once its head arrived.

        Raises:
            UpstreamConnectError, UpstreamRefused: no connection could be made.
            UpstreamClosed, UpstreamProtocolError: the worker failed before the head.
            TimeoutError: connect or head later than the timeouts.
        """
        return self.request(base, path, headers, body, get=False)

    async def get(self, base: str, path: str, *, limit: int) -> tuple[int, bytes]:
        """``GET path`` from the worker at ``base`` (a scrape): its status and its body,
        read to its end, or to ``limit`` + 1 bytes (then the connection is closed: the
        caller refuses a body that long). Raises as :meth:`post`, and ``TimeoutError``
        when the body stalls for the read timeout."""
        response = await self.request(base, path, (), b"", get=True)
        chunks: list[bytes] = []
        size = 0
        try:
            while size <= limit:
                data = await response.readany()
                if not data:
                    break
                chunks.append(data)
                size += len(data)
        except BaseException:
            response.close()
            raise
        if size > limit:
            response.close()
        else:
            response.release()
        return response.status, b"".join(chunks)

    async def request(
        self,
        base: str,
        path: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        *,
        get: bool,
    ) -> UpstreamResponse:
        """:meth:`post`, or a ``GET`` without a body (``get``)."""
        if self._closed:
            raise UpstreamClosed("the upstream pool is closed")
        # (The usual request inlines the lookups, the slot, the idle connection and the
        # connection's start: no call for what a dict lookup or a test answers.)
        target = self._targets.get(base)
        if target is None:
            target = self._target(base)
        if self._refuse_plain and not target.tls:
            raise UpstreamRefused(
                f"refusing http:// to {target.host}:{target.port}: TLS is configured, so "
                "workers must be https:// (no plaintext fallback)"
            )
        # One string, encoded once and sent with the body in one write. (A plain loop
        # is the cheapest way to drop a field holding CR or LF, which cannot be sent as
        # one header: the server's parser forbids it.)
        if get:
            lines = [target.get_head(path)]
        else:
            head = target.heads.get(path)
            lines = [target.head(path) if head is None else head]
        for name, value in headers:
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                continue
            lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n" if get else f"Content-Length: {len(body)}\r\n\r\n")
        request = "".join(lines).encode("utf-8", "surrogateescape") + body
        slots = target.slots
        if slots.free > 0:
            # A slot given back while a request waits goes to it (free stays 0), so a
            # free slot means nobody waits.
            slots.free -= 1
        else:
            await slots.wait(asyncio.get_running_loop())
        # The most recently used idle connection still fit for reuse (the ones no longer
        # fit are dropped on the way), else a new one.
        conn: _Connection | None = None
        idle = target.idle
        if idle:
            now = self._monotonic()
            while idle:
                candidate = idle.pop()
                if (
                    candidate.keep_alive
                    and not candidate.closed
                    and now - candidate.idle_since < self._idle_s
                ):
                    conn = candidate
                    break
                self._drop(candidate)
        if conn is None:
            try:
                conn = await self._connect(target, asyncio.get_running_loop())
            except BaseException:
                slots.give()
                raise
        # (The head wait inlined: a timer on the future, as readany's, no coroutine;
        # the connection's loop is the running one, without asking for it again.)
        # Send the request; the waiter is done when the response's head has arrived.
        loop = conn.loop
        transport = conn.transport
        assert transport is not None  # (set as the connection was made)
        conn._state = _HEAD
        conn.buffered = 0
        waiter = conn._head_waiter = loop.create_future()
        transport.write(request)
        deadlines = self._deadlines
        deadlines.add(waiter, loop)
        try:
            await waiter
        except BaseException:
            self._done(conn, False)  # the worker sees the request go away
            raise
        finally:
            deadlines.discard(waiter)
        return UpstreamResponse(conn, loop, deadlines, self._done)

    async def _connect(self, target: _Target, loop: asyncio.AbstractEventLoop) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self._response_heads),
                    target.host,
                    target.port,
                    ssl=self._tls_context() if target.tls else None,
                    server_hostname=target.host if target.tls else None,
                )
        except OSError as exc:
            raise UpstreamConnectError(f"{target.host}:{target.port}", exc) from None
        conn.target = target
        self._open.add(conn)
        return conn

    def _done(self, conn: _Connection, reuse: bool) -> None:
        target = conn.target
        assert target is not None  # set when the connection was made
        slots = target.slots
        slots.give()
        if reuse and not self._closed:
            if conn.chunks:
                conn.chunks.clear()  # a body offered whole and not read: not kept idle
            conn.body = None
            conn._state = _IDLE
            conn.idle_since = self._monotonic()
            target.idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    async def close(self) -> None:
        """Close every connection (in use or idle)."""
        self._closed = True
        self._deadlines.close()
        for conn in list(self._open):
            self._drop(conn)
        for target in self._targets.values():
            target.idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


__all__ = [
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamProtocolError",
    "UpstreamRefused",
    "UpstreamResponse",
]

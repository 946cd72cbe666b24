"""A lean HTTP/1.1 server for a tier's hot endpoints, beside aiohttp's on one socket.

aiohttp's server is general: routing tables, middleware chains, request and response
objects with their hooks, a header builder per response. A proxy's hot endpoints need a
small part of HTTP/1.1 (RFC 9112): a ``POST`` with a ``Content-Length`` body, answered
with a whole body or a stream, on keep-alive connections. This module serves that part
on a bare ``asyncio.Protocol`` (heads parsed by ``httptools``, llhttp's C parser) and
hands everything else to aiohttp, on the same connection:

* **What it serves**: HTTP/1.0 or 1.1, a method and path it has a :class:`Route` for,
  a body framed by ``Content-Length`` (or none). Anything else — another path, a
  chunked body, ``Expect: 100-continue``, ``Upgrade``, a head it cannot parse (aiohttp
  answers it the 400 it always did), a head past a ceiling of aiohttp's parser (target
  length, field count, one field's size: its 400 too), a percent-encoded or absolute
  target — goes to aiohttp, so both servers of a listener answer the same bytes alike
  however they arrive: the connection's protocol becomes aiohttp's
  (``runner.server()``), which gets the connection's bytes from the start of that
  request. Every handoff is counted
  by why (``gtm_http_fallbacks_total{tier,reason}``): a fast path is a declared
  capability, and losing it shows.
* **The same rules**: each request passes what aiohttp's middlewares apply, from their
  one home each: the span (:class:`gtm.tracing.Spans`), the access line
  (:class:`gtm.access.AccessLog`), the limits (:mod:`gtm.http_limits`: header fields
  431, per-client concurrency 429, body size 413, slow body 408, JSON depth 400, the
  header timeout), OpenAI-shaped errors and the per-route count
  (:func:`gtm.openai_errors.answer`). The handler answers through the relay's seam
  (:class:`gtm.relay.Downstream`).
* **Connections**: keep-alive until ``header_timeout_s`` passes with no complete head
  (slowloris bounded too); pipelined requests are answered in order, one at a time;
  reading is paused while more than :data:`PIPELINE_BYTES` wait behind the request being
  answered, and otherwise kept on, so a client that leaves is seen at once: its handler
  is cancelled (the relay closes the upstream). Writes wait while the transport's
  buffer is above its high-water mark (``pause_writing``), so a slow client slows the
  relay's reads of the upstream. A connection closed after a response lingers as
  aiohttp's does (our side shut, the client's bytes dropped for ``lingering_s``), so an
  answer refused before a body was read is not lost to a reset.
* **Stopping** (:meth:`LeanFront.shutdown`): idle connections are closed, in-flight
  requests get the grace period (their responses end with ``Connection: close``), then
  are cancelled.
* **TLS**: the listener's SSL context, as aiohttp's; the handoff works on asyncio's SSL
  transport, and :attr:`Request.transport` gives the peer's certificate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from enum import StrEnum
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

import httptools
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter

from gtm.access import NOTE_KEY, AccessLog, AccessNote, End
from gtm.http_limits import (
    ServerLimits,
    body_too_deep,
    body_too_large,
    body_too_slow,
    fields_fit,
    header_problem,
    headers_too_large,
)
from gtm.models import Tier
from gtm.openai_errors import ApiError, answer
from gtm.relay import Downstream
from gtm.serve import CLIENT_CLOSED
from gtm.tracing import SPAN_KEY, Spans

if TYPE_CHECKING:
    from gtm.tracing import _Hop

log = logging.getLogger(__name__)

#: Bytes of later (pipelined) requests buffered while one is answered; above, reading
#: pauses until it is done.
PIPELINE_BYTES = 64 * 1024

#: aiohttp's parser's request-target ceiling (its ``max_line_size`` default, which
#: :meth:`gtm.http_limits.HttpLimits.handler_args` leaves alone): a longer target is
#: aiohttp's 400, so the lean server hands it over rather than serve it.
AIOHTTP_MAX_LINE = 8190

Handler = Callable[["Request", Downstream], Awaitable[None]]


class Fallback(StrEnum):
    """Why a connection went to aiohttp: the ``reason`` of ``gtm_http_fallbacks_total``."""

    #: No lean route for the method and path (probes, scrapes, other APIs).
    ROUTE = "route"
    #: A target aiohttp must decode (percent-encoded, absolute-form).
    TARGET = "target"
    #: A head llhttp refused (aiohttp answers 400, as it always did).
    MALFORMED = "malformed"
    #: Neither HTTP/1.0 nor HTTP/1.1.
    VERSION = "version"
    #: A chunked (or otherwise transfer-coded) request body.
    CHUNKED = "chunked"
    #: ``Expect: 100-continue``.
    EXPECT = "expect"
    #: ``Upgrade`` (WebSocket, h2c).
    UPGRADE = "upgrade"
    #: A head over the limits before its end, or past a ceiling of aiohttp's parser
    #: (target length, field count, one field's size): aiohttp answers it.
    HEAD_TOO_LARGE = "head_too_large"


@dataclass(frozen=True, slots=True)
class Route:
    """A method and path the lean server answers itself."""

    method: str
    path: str
    handler: Handler


class Request:
    """One request as the lean server read it (a :class:`gtm.inbound.Scope`)."""

    __slots__ = (
        "_state",
        "body",
        "fields",
        "get",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
        "remote",
        "transport",
        "version",
    )

    #: What a rule keeps for this request under a key (None: nothing): the state's own
    #: ``dict.get``, so a lookup is no Python call.
    get: Callable[[Any], Any]

    def __init__(
        self,
        method: str,
        path: str,
        query: str,
        version: str,
        headers: list[tuple[str, str]],
        remote: str | None,
        transport: asyncio.Transport,
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.version = version
        #: The fields as sent (decoded UTF-8, undecodable bytes surrogate-escaped).
        self.headers: CIMultiDict[str] = CIMultiDict(headers)
        #: The same fields as a list, in order: a reader of them all (``end_to_end``'s
        #: ``fields``) reads it instead of the mapping's items.
        self.fields = headers
        self.remote = remote
        #: The connection's transport (``get_extra_info("peercert")`` under TLS).
        self.transport = transport
        self.keep_alive = keep_alive
        self.body = b""
        state: dict[object, Any] = {}
        self._state = state
        self.get = state.get

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """The fields' bytes as sent (the decoding is undone exactly)."""
        return _raw(self.headers.items())

    def __setitem__(self, key: object, value: object) -> None:
        self._state[key] = value


def _raw(fields: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(n.encode(_UTF8, _ESCAPE), v.encode(_UTF8, _ESCAPE)) for n, v in fields]


_UTF8 = "utf-8"
_ESCAPE = "surrogateescape"


class _Errors:
    def __init__(self, service: str, count: Callable[[str, int], None]) -> None:
        self.service = service
        self.count = count


class LeanFront:
    """The lean server's routes and the rules it shares with the aiohttp application
    beside it; :class:`gtm.serve.HttpServer` serves it on the application's socket."""

    def __init__(
        self,
        routes: Iterable[Route],
        *,
        tier: Tier,
        limits: ServerLimits,
        service: str,
        count: Callable[[str, int], None],
        registry: CollectorRegistry,
        access: AccessLog | None = None,
        spans: Spans | None = None,
    ) -> None:
        #: By (method, path) as sent: the handler, and the method and path as str.
        self.routes: Mapping[tuple[bytes, bytes], tuple[Handler, str, str]] = {
            (r.method.upper().encode(), r.path.encode()): (r.handler, r.method.upper(), r.path)
            for r in routes
        }
        self.limits = limits
        parser = limits.limits.handler_args()
        #: aiohttp's parser's ceilings (its 400s): a head past one is handed to it.
        self.max_fields = int(parser.get("max_headers", 128))
        self.max_field = int(parser.get("max_field_size", 8190))
        self.max_line = int(parser.get("max_line_size", AIOHTTP_MAX_LINE))
        #: A head this small (its bytes plus one per field) has no field over the limits.
        self.fields_fit = fields_fit(limits.limits)
        self.errors = _Errors(service, count)
        self.access = access
        self.spans = spans
        counter = Counter(
            "gtm_http_fallbacks",
            "Connections the lean HTTP server handed to aiohttp's, by why (a request it "
            "does not serve itself).",
            ("tier", "reason"),
            registry=registry,
        )
        self._fallbacks = {r: counter.labels(tier.value, r.value).inc for r in Fallback}
        self._connections: set[_Connection] = set()
        self._stopping = False
        self.date = _Date()

    def fell_back(self, reason: Fallback) -> None:
        self._fallbacks[reason]()

    def protocol(self, fallback: Callable[[], asyncio.Protocol]) -> Callable[[], _Connection]:
        """The listener's protocol factory; ``fallback`` makes aiohttp's protocol."""

        def make() -> _Connection:
            return _Connection(self, fallback)

        return make

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections; in-flight requests get ``grace_s``, then are
        cancelled (each connection closes once its response ends)."""
        self._stopping = True
        for conn in list(self._connections):
            conn.stop()
        busy = [c.task for c in self._connections if c.task is not None]
        if busy:
            _, late = await asyncio.wait(busy, timeout=grace_s)
            for conn in list(self._connections):
                conn.cancel()
            if late:
                await asyncio.wait(late, timeout=grace_s)
        for conn in list(self._connections):
            conn.close()


# ---------------------------------------------------------------------------- dates


class _Date:
    """``Date`` (RFC 9110 §6.6.1) for a server's responses, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def __call__(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True)
        return self._value


# ---------------------------------------------------------------------------- connection


class _Head:
    """httptools' callbacks for a connection's request heads (one parser a connection,
    reset for each head)."""

    __slots__ = ("complete", "headers", "length", "special", "url")

    def __init__(self) -> None:
        self.url = b""
        #: The fields, decoded as :attr:`Request.headers` holds them.
        self.headers: list[tuple[str, str]] = []
        self.length = 0
        #: A header that sends the request to aiohttp, or None.
        self.special: Fallback | None = None
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        known = _KNOWN.get(name)
        if known is not None:
            # A common field as clients spell it: its name decoded once, at import.
            text, is_length = known
            self.headers.append((text, value.decode(_UTF8, _ESCAPE)))
            if is_length:
                self.length = int(value)  # llhttp checked it: digits only, one value
            return
        self.headers.append((name.decode(_UTF8, _ESCAPE), value.decode(_UTF8, _ESCAPE)))
        low = name.lower()
        if low == b"content-length":
            self.length = int(value)  # llhttp checked it: digits only, one value
        elif low == b"transfer-encoding":
            self.special = Fallback.CHUNKED
        elif low == b"expect":
            self.special = Fallback.EXPECT
        elif low == b"upgrade":
            self.special = Fallback.UPGRADE

    def on_headers_complete(self) -> None:
        self.complete = True


#: Common request fields as clients spell them, by their bytes: the name decoded, and
#: whether it is Content-Length (the others are none of those :class:`_Head` looks for).
_KNOWN = {
    spelled: (spelled.decode(), name == b"Content-Length")
    for name in (
        *(b"Host", b"Content-Type", b"Content-Length", b"User-Agent", b"Accept"),
        *(b"Accept-Encoding", b"Authorization", b"Connection", b"X-Request-Id"),
        *(b"Traceparent", b"Tracestate"),
    )
    for spelled in (name, name.lower())
}


class _Connection(asyncio.Protocol):
    """One client connection: heads parsed, requests answered in order, or handed off.

    One ``httptools`` parser reads all of the connection's requests: each head is fed
    to it when complete, each body once taken (a body is fed whole, so the parser is at
    the start of a message again); a request it refuses hands the connection off."""

    def __init__(self, front: LeanFront, fallback: Callable[[], asyncio.Protocol]) -> None:
        self._front = front
        self._fallback = fallback
        self._transport: asyncio.Transport | None = None
        self._remote: str | None = None
        self._buffer = bytearray()
        #: How far the buffer was searched for a head's end (a head in many small
        #: writes is scanned once, not once per write).
        self._scanned = 0
        self._loop = asyncio.get_running_loop()
        self._head = _Head()
        self._parser = httptools.HttpRequestParser(self._head)
        self._timer: asyncio.TimerHandle | None = None
        #: Loop time since which the connection waits for a complete head.
        self._idle_since = 0.0
        #: The request being answered (its task), if any.
        self.task: asyncio.Task[None] | None = None
        #: Set when the answered request's body is complete (only while it is not).
        self._body_wait: asyncio.Future[None] | None = None
        self._body_need = 0
        self._writable = True
        self._drain: asyncio.Future[None] | None = None
        self._reading = True
        self._closed = False
        self._stop = False
        #: Closing after a response: our side is shut, the client's bytes are dropped.
        self._lingering = False

    # ------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but are ones.
        self._transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple | list) and peer:
            self._remote = str(peer[0])
        self._front._connections.add(self)
        if self._front._stopping:
            self.close()
            return
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._front._connections.discard(self)
        self._disarm()
        if self.task is not None:
            self.task.cancel()  # the client left: the handler stops, the relay cleans up
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client went away"))
        if self._body_wait is not None and not self._body_wait.done():
            self._body_wait.set_exception(ConnectionResetError("the client went away"))

    def eof_received(self) -> bool | None:
        return None  # as aiohttp: a client's half-close closes the connection

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def data_received(self, data: bytes) -> None:
        """Bytes from the client; with none (``b""``), what is buffered is read on: the
        next request is answered, or the connection handed off, or more bytes awaited."""
        if self._lingering:
            return  # the rest of a refused request, read and dropped until the close
        buffer = self._buffer
        buffer += data
        if self.task is not None:
            if self._body_wait is not None and len(buffer) >= self._body_need:
                if not self._body_wait.done():
                    self._body_wait.set_result(None)
            elif len(buffer) > self._body_need + PIPELINE_BYTES and self._reading:
                self._reading = False
                assert self._transport is not None
                self._transport.pause_reading()
            return
        # ------------------------------------------------------------ the next request
        if not buffer or self._closed:
            return
        start = self._scanned - 3
        end = buffer.find(b"\r\n\r\n", start if start > 0 else 0)
        if end < 0:
            limits = self._front.limits.limits
            if buffer.find(b"\n\n", start if start > 0 else 0) >= 0:
                self._hand_off(Fallback.MALFORMED)  # bare LF line ends: aiohttp's call
            elif len(buffer) > limits.max_header_bytes + limits.max_header_line_bytes:
                self._hand_off(Fallback.HEAD_TOO_LARGE)
            else:
                self._scanned = len(buffer)
            return
        self._scanned = 0
        head_len = end + 4
        head = self._head
        head.url = b""
        fields: list[tuple[str, str]] = []
        head.headers = fields
        head.length = 0
        head.special = None
        head.complete = False
        parser = self._parser
        try:
            parser.feed_data(buffer[:head_len])  # a copy the parser reads, not kept
        except httptools.HttpParserUpgrade:
            self._hand_off(Fallback.UPGRADE)
            return
        except (httptools.HttpParserError, ValueError):
            self._hand_off(Fallback.MALFORMED)
            return
        if not head.complete:
            self._hand_off(Fallback.MALFORMED)
            return
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            self._hand_off(Fallback.VERSION)
            return
        if head.special is not None or parser.should_upgrade():
            self._hand_off(head.special or Fallback.UPGRADE)
            return
        front = self._front
        url = head.url
        count = len(fields)
        if (
            len(url) > front.max_line
            or count > front.max_fields
            or (head_len > front.max_field and self._past_field_ceiling(fields))
        ):
            self._hand_off(Fallback.HEAD_TOO_LARGE)
            return
        if b"?" in url:
            raw_path, _, raw_query = url.partition(b"?")
            query = raw_query.decode("latin-1")
        else:
            raw_path, query = url, ""
        target = front.routes.get((parser.get_method(), raw_path))
        if target is None:
            self._hand_off(Fallback.TARGET if b"%" in raw_path else Fallback.ROUTE)
            return
        handler, method, path = target
        transport = self._transport
        assert transport is not None
        request = Request(
            method,
            path,
            query,
            version,
            fields,
            self._remote,
            transport,
            parser.should_keep_alive(),
        )
        self._body_need = head_len + head.length
        self.task = self._loop.create_task(
            self._answer(request, handler, head_len, head.length, count)
        )

    def _past_field_ceiling(self, fields: list[tuple[str, str]]) -> bool:
        """Whether aiohttp's parser would refuse one of these fields (400) where the
        limits would answer 431 or nothing: both servers of a listener answer the same
        bytes alike, however they arrive. (Only a head over ``max_field`` can hold one.)"""
        most = self._front.max_field
        # aiohttp refuses a name of max_field bytes, a value of one more.
        return any(len(n) >= most or len(v) > most for n, v in _raw(fields))

    def _take_body(self, request: Request, head_len: int) -> None:
        """The body is in the buffer: the request's, and the parser's (which then waits
        for the next head)."""
        need = self._body_need
        buffer = self._buffer
        if need > head_len:
            request.body = body = bytes(buffer[head_len:need])
            self._parser.feed_data(body)
        del buffer[:need]
        self._body_need = 0

    async def _answer(
        self, request: Request, handler: Handler, head_len: int, length: int, fields: int
    ) -> None:
        """Answer one request, the limits first: one coroutine, which awaits only the
        handler (and the rest of the body, when it is still arriving)."""
        front = self._front
        spans, access = front.spans, front.access
        hop = note = None
        if spans is not None and request.path not in spans.skip:
            hop = request._state[SPAN_KEY] = spans.start(request)
        if access is not None and request.path not in access.skip:
            note = request._state[NOTE_KEY] = access.begin(request)
        client = _Response(self, request, access, note, hop)
        server = front.limits
        limits = server.limits
        slots = server.slots
        taken: str | None = None
        status, end = 500, End.ERROR
        try:
            problem = None
            if fields > limits.max_headers or head_len + fields > front.fields_fit:
                problem = header_problem(request.raw_headers, limits)
            peer = request.remote or "-"
            if problem is not None:
                client.refuse(headers_too_large(problem), close=True)
            elif (refused := slots.take(peer)) is not None:
                whole = len(self._buffer) >= self._body_need
                if whole:
                    self._take_body(request, head_len)  # dropped: the connection stays usable
                client.refuse(refused, close=not whole)
            else:
                taken = peer
                if length > server.max_body_bytes:
                    client.refuse(body_too_large(length, server.max_body_bytes), close=True)
                elif len(self._buffer) < self._body_need and not await self._body_in(
                    limits.body_timeout_s
                ):
                    client.refuse(body_too_slow(limits), close=True)
                else:
                    need = self._body_need  # the body is in: the request's and the parser's
                    if need > head_len:
                        request.body = body = bytes(self._buffer[head_len:need])
                        self._parser.feed_data(body)
                    del self._buffer[:need]
                    self._body_need = 0
                    body = request.body
                    deep = body_too_deep(body, limits)
                    if deep is not None:
                        client.refuse(deep, close=False)
                    else:
                        errors = front.errors
                        try:
                            await handler(request, client)
                        except (asyncio.CancelledError, ConnectionResetError):
                            raise
                        except Exception as exc:
                            if client.head_sent:
                                raise  # a started response cannot become an error: cut
                            error = answer(exc, errors.service, request.method, request.path)
                            client.refuse(error, close=False)
                        errors.count(request.path, client.status)
            # A whole response was written as it was made (:meth:`_Response.whole`),
            # unless the client had gone by then.
            if client.unsent:
                raise ConnectionResetError("the client went away")
            if not client.head_sent:
                raise RuntimeError("the handler made no response")
            status, end = client.status, End.OK
        except asyncio.CancelledError:
            end = End.DISCONNECT
            status = client.status if client.head_sent else CLIENT_CLOSED
            if not self._closed:
                client.close = True  # stopping: the response (if any) was cut
                self.abort()
            raise
        except (ConnectionResetError, OSError):
            end = End.DISCONNECT
            status = client.status if client.head_sent else CLIENT_CLOSED
        except Exception:
            log.exception("the lean server failed answering %s %s", request.method, request.path)
            self.abort()
        finally:
            if taken is not None:
                slots.give(taken)
            if note is not None and access is not None:
                access.end(request, note, status, end)
            if hop is not None and spans is not None:
                hop.body = client.whole_body
                spans.finish(hop, status, end.value)
            # The request is answered: keep the connection for the next one, or close
            # (inline, no call per request; no return in a finally).
            self.task = None
            if self._closed:
                pass
            elif not client.ended:
                self.close()
            elif client.close or self._stop:
                self._linger()
            else:
                if not self._reading:
                    self._reading = True
                    assert self._transport is not None
                    self._transport.resume_reading()
                # The header timer runs from now (the timer is moved only when it fires).
                self._idle_since = self._loop.time()
                if self._timer is None:
                    self._arm_idle()
                if self._buffer:
                    self.data_received(b"")  # the next request, pipelined

    async def _body_in(self, timeout_s: float) -> bool:
        """Wait for the rest of the body: False when it did not arrive in ``timeout_s``."""
        waiter = self._body_wait = self._loop.create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            return False
        finally:
            self._body_wait = None
        return True

    # ------------------------------------------------------------------ handoff

    def _hand_off(self, reason: Fallback) -> None:
        """The connection becomes aiohttp's, from the start of this request."""
        self._front.fell_back(reason)
        self._disarm()
        self._front._connections.discard(self)
        transport = self._transport
        assert transport is not None
        protocol = self._fallback()
        protocol.connection_made(transport)
        transport.set_protocol(protocol)
        if not self._reading:
            transport.resume_reading()
        data, self._buffer = bytes(self._buffer), bytearray()
        protocol.data_received(data)

    # ------------------------------------------------------------------ timers, writes

    def _arm_idle(self) -> None:
        """The header timer runs from now. One timer per connection, moved lazily: when
        it fires early (requests were answered meanwhile) it is set again for the rest."""
        loop = self._loop
        self._idle_since = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(
                self._idle_since + self._front.limits.limits.header_timeout_s, self._idle_timeout
            )

    def _linger(self) -> None:
        """Close after a whole response, as aiohttp does (its ``lingering_time``): our
        side is shut (the client reads the answer to its end), what it still sends (a
        refused request's body) is read and dropped for ``lingering_s``, then the
        connection closes. Closing with unread bytes would reset the connection, and
        a reset can destroy the answer before the client reads it (RFC 9112 §9.6)."""
        transport = self._transport
        linger_s = self._front.limits.limits.lingering_s
        if transport is None or transport.is_closing() or linger_s <= 0:
            self.close()
            return
        if not transport.can_write_eof():  # TLS: no half-close
            self.close()
            return
        self._lingering = True
        self._buffer = bytearray()
        self._disarm()
        transport.write_eof()
        if not self._reading:
            self._reading = True
            transport.resume_reading()
        self._timer = self._loop.call_later(linger_s, self.close)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_timeout(self) -> None:
        self._timer = None
        if self._closed:
            return
        timeout = self._front.limits.limits.header_timeout_s
        due = (self._loop.time() if self.task is not None else self._idle_since) + timeout
        if self.task is None and due <= self._loop.time():
            self.close()  # no complete head in time (an idle keep-alive or a slowloris)
        else:
            self._timer = self._loop.call_at(due, self._idle_timeout)

    def write(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionResetError("the client went away")
        assert self._transport is not None
        self._transport.write(data)

    async def drain(self) -> None:
        if self._closed:
            raise ConnectionResetError("the client went away")
        if self._writable:
            return
        if self._drain is None:
            self._drain = self._loop.create_future()
        await self._drain

    def gone(self) -> bool:
        return self._closed or self._transport is None or self._transport.is_closing()

    def stop(self) -> None:
        """A graceful stop: close when idle, after the response in flight otherwise."""
        self._stop = True
        if self.task is None:
            self.close()

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def close(self) -> None:
        self._disarm()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def abort(self) -> None:
        self._disarm()
        if self._transport is not None:
            self._transport.abort()


# ---------------------------------------------------------------------------- responses


class _Response(Downstream):
    """The lean server's :class:`~gtm.relay.Downstream`: a whole response is written as
    it is made (head and body in one write); a stream's head leaves with its first
    chunk; a body without a length is chunked (HTTP/1.1) or ends the connection (1.0)."""

    __slots__ = (
        "_access",
        "_chunked",
        "_conn",
        "_head",
        "_hop",
        "_note",
        "_version",
        "close",
        "ended",
        "head_sent",
        "status",
        "unsent",
        "whole_body",
    )

    def __init__(
        self,
        conn: _Connection,
        request: Request,
        access: AccessLog | None,
        note: AccessNote | None,
        hop: _Hop | None,
    ) -> None:
        self._conn = conn
        self._version = request.version
        self._access = access
        self._note = note
        self._hop = hop
        #: A whole response was made after the client went away (not written).
        self.unsent = False
        self._head: bytes | None = None
        self._chunked = False
        self.status = 500
        self.head_sent = False
        self.ended = False
        #: Close the connection once the response ends.
        self.close = not request.keep_alive
        #: A whole response's body (a span reads an error's code from it).
        self.whole_body: bytes | None = None

    def gone(self) -> bool:
        return self._conn.gone()

    def whole(self, status: int, reason: str, headers: CIMultiDict[str], body: bytes) -> None:
        """The whole response, written at once: the client has it before the handler's
        bookkeeping after it (the relay's releases and observations) runs."""
        if self.head_sent:
            raise RuntimeError("a response was already sent")
        self.status = status
        conn = self._conn
        if conn._closed:
            self.unsent = True  # the handler's end says the client went away
            return
        headers["Content-Length"] = str(len(body))
        self.whole_body = body
        head = self._make_head(status, reason, headers)
        conn.write(head + body)
        self.head_sent = self.ended = True

    def refuse(self, error: ApiError, *, close: bool) -> None:
        """An error in OpenAI's shape as the whole response (``close``: then close)."""
        headers: CIMultiDict[str] = CIMultiDict(error.headers())
        headers["Content-Type"] = "application/json; charset=utf-8"
        if close:
            self.close = True
        self.whole(error.status, "", headers, error.encode())

    async def start(
        self, status: int, reason: str, headers: CIMultiDict[str], length: int | None
    ) -> None:
        self.status = status
        if length is not None:
            headers["Content-Length"] = str(length)
        elif self._version == "1.1":
            headers["Transfer-Encoding"] = "chunked"
            self._chunked = True
        else:
            self.close = True  # HTTP/1.0: the end of the connection ends the body
        self._head = self._make_head(status, reason, headers)
        self.head_sent = True

    async def write(self, data: bytes) -> None:
        if not data:
            return
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        head, self._head = self._head, None
        conn = self._conn
        conn.write(data if head is None else head + data)
        await conn.drain()

    async def write_eof(self) -> None:
        head, self._head = self._head, None
        tail = b"0\r\n\r\n" if self._chunked else b""
        if head is not None or tail:
            self._conn.write((head or b"") + tail)
        self.ended = True

    def abort(self) -> None:
        self._conn.abort()

    def _make_head(self, status: int, reason: str, headers: CIMultiDict[str]) -> bytes:
        note = self._note
        if note is not None and self._access is not None:
            self._access.prepared(note, status, headers)
        if "Date" not in headers:
            headers["Date"] = self._conn._front.date()
        if "Content-Type" not in headers:
            headers["Content-Type"] = "application/octet-stream"
        version = self._version
        if self.close or self._conn._stop:
            self.close = True
            headers["Connection"] = "close"
        elif version == "1.0":
            headers["Connection"] = "keep-alive"
        hop = self._hop
        if hop is not None:
            hop.response = headers
            hop.status = status
        line = _STATUS_LINES.get((version, status, reason))
        if line is None:
            line = f"HTTP/{version} {status} {reason or _reason(status)}\r\n"
        # The fields are never none (Date and Content-Type at least).
        text = line + "\r\n".join(map(": ".join, headers.items())) + "\r\n\r\n"
        if text.count("\n") != len(headers) + 2:
            raise ValueError("a response header holds a line break")
        return text.encode(_UTF8, _ESCAPE)


#: Reason phrases by status (RFC 9110's), for responses made without one.
_REASONS = {s.value: s.phrase for s in HTTPStatus}


def _reason(status: int) -> str:
    return _REASONS.get(status, "")


#: Status lines by (version, status, reason) for RFC 9110's statuses with their phrase
#: or none (then the phrase): built once, not per response.
_STATUS_LINES = {
    (version, status, given): f"HTTP/{version} {status} {phrase}\r\n"
    for version in ("1.0", "1.1")
    for status, phrase in _REASONS.items()
    for given in ("", phrase)
}


__all__ = ["PIPELINE_BYTES", "Fallback", "LeanFront", "Request", "Route"]

"""The reverse proxy every tier forwards with: one retry loop, one hop-by-hop set.

The front door (to a region's regional LB), the regional LB (to a zone agent or a peer
region) and the zone agent (to a GPU worker) carry a request the same way; only where
it goes, what it is charged to and which headers it gains differ. Those are the hooks
of :class:`Relay`; the loop and the byte relay are here, once:

* **Retries** only before the first byte reaches the client, to a target not tried
  yet, at most ``max_attempts`` in all (ARCHITECTURE §6: 3). An attempt fails on a
  connect failure, a timeout or reset before the first body byte, or a status the tier
  retries (:meth:`Relay.retry_status`). The first body byte is read *before* the client
  gets the status line, so a target that fails between its headers and its first byte
  is still retried. Residency is the caller's: :meth:`Relay.next_target` only ever
  offers targets inside the allowed set.
* **Streaming**: the response is relayed chunk by chunk as it arrives, never buffered
  or decompressed. A body that arrives whole with its head (:attr:`Upstream.body`) or
  in the first read (``Content-Length`` met) is answered as one response, so headers
  and body leave in one write.
* **After the first byte** a failure cannot be retried, and a partial answer must never
  look complete (:meth:`Relay.forward`'s cut): a streaming (SSE) client gets OpenAI's
  error event (``data: {"error": {...}}``, the shape of :mod:`gtm.openai_errors`, which
  the OpenAI SDKs raise as an ``APIError``) and a clean end without ``[DONE]``; any
  other body is cut by resetting the client's connection, so its short body or missing
  last chunk shows (a clean end would make a truncated JSON body look whole). The tier
  above relays the error event as it relays any bytes and sees a clean end: a break is
  counted and logged once, by the tier whose upstream hop broke.
* **Breaks** (:class:`BreakCause`, ``gtm_stream_breaks_total{tier,cause}``,
  :class:`StreamBreaks`): every response that ends early after its first byte reached
  the client is counted by why — the upstream failed (``upstream_reset``) or went
  silent past its read timeout (``upstream_timeout``), the client went away
  (``client_disconnect``: no product failure, logged at DEBUG, not as a warning), or the
  server cancelled the handler while stopping (``cancelled``), or the upstream failed
  after the event stream's ``[DONE]`` (``after_done``: the client has its whole answer
  and gets a clean end). An upstream break is logged once at WARNING with its cause and
  the library's message, never a traceback.
* **Cancellation**: a client that goes away cancels the handler; the upstream response
  is closed (the target sees the disconnect and aborts) and the attempt's release
  (:meth:`Relay.begin`) runs in a ``finally``.
* **Headers**: :data:`HOP_BY_HOP` (RFC 9110 §7.6.1, the classic list and what the proxy
  recomputes) and the names a ``Connection`` header lists never cross, either way.

Upstream clients plug in behind :class:`Upstream` (status, headers, ``readany``,
``release``/``close``): :class:`AiohttpUpstream` here for the front door and the
regional LB, the zone's own lean client (:mod:`zone_agent.upstream`) for the zone.
Library errors are translated at that seam into :class:`~gtm.errors.UpstreamError`
and :class:`~gtm.errors.AttemptFailed`.

The client's side plugs in behind :class:`Downstream` (start a response, write, end it,
the whole response in one write, abort; whether the client is gone), beside the
request as handlers read it (:class:`gtm.inbound.Scope`: method, path, headers, peer,
per-request state): :class:`AiohttpDownstream` for aiohttp's server (the front door, the
regional LB, the zone's aiohttp front), :mod:`gtm.http1`'s own for its lean server. The
loop (:class:`RelayLoop`) sees only the two seams; :class:`Relay` is the loop bound to an
aiohttp request, whose :meth:`Relay.forward` returns the handler's response.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry, Counter

from gtm import tracing
from gtm.errors import AttemptFailed, UpstreamError
from gtm.inbound import Scope
from gtm.models import Tier
from gtm.openai_errors import ApiError, ErrorType

log = logging.getLogger(__name__)

#: Headers that never cross the proxy: hop-by-hop ones (RFC 9110 §7.6.1: Connection,
#: Proxy-Connection, Keep-Alive, TE, Transfer-Encoding, Upgrade; RFC 7230's classic list
#: adds Proxy-Authenticate, Proxy-Authorization, Trailer, and "Trailers" as RFC 2616
#: misspelled it), and those the proxy sets itself (Host, Content-Length).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

#: Bytes of an upstream's error body kept for the message of a retried attempt.
ERROR_BODY_BYTES = 4096
#: Longest wait for that body, s (it only feeds a message).
ERROR_BODY_WAIT_S = 5.0


class Failure(StrEnum):
    """How an attempt failed before its first byte (:attr:`AttemptFailed.kind`)."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    RESET = "reset"
    STATUS = "status"


class Ending(StrEnum):
    """How a relayed response ended."""

    COMPLETED = "completed"
    #: The upstream went silent after the first byte: the client was cut.
    CUT_TIMEOUT = "cut-timeout"
    #: The upstream failed after the first byte: the client was cut.
    CUT_RESET = "cut-reset"
    #: The client went away: nobody's fault upstream.
    CLIENT_GONE = "client-gone"
    #: The handler was cancelled with its client still connected (the server stopping).
    CANCELLED = "cancelled"
    #: The upstream failed after an event stream's ``[DONE]``: the client has its whole
    #: answer, only the end of the HTTP body was lost; it gets a clean end.
    CUT_AFTER_DONE = "cut-after-done"

    @property
    def cause(self) -> BreakCause | None:
        """Why the response broke after its first byte (``None``: it completed)."""
        return _CAUSES.get(self)


class BreakCause(StrEnum):
    """Why a relayed response ended early after its first byte reached the client: the
    ``cause`` label of ``gtm_stream_breaks_total``."""

    #: The upstream's connection or response failed mid-body (reset, closed, not HTTP).
    UPSTREAM_RESET = "upstream_reset"
    #: The upstream sent nothing for its read timeout mid-body (a silent upstream).
    UPSTREAM_TIMEOUT = "upstream_timeout"
    #: The client went away: not a product failure.
    CLIENT_DISCONNECT = "client_disconnect"
    #: The server cancelled the handler while the client was still there (stopping).
    CANCELLED = "cancelled"
    #: The upstream broke after the stream's ``[DONE]``: the client's answer is whole.
    AFTER_DONE = "after_done"


_CAUSES = {
    Ending.CUT_RESET: BreakCause.UPSTREAM_RESET,
    Ending.CUT_TIMEOUT: BreakCause.UPSTREAM_TIMEOUT,
    Ending.CLIENT_GONE: BreakCause.CLIENT_DISCONNECT,
    Ending.CANCELLED: BreakCause.CANCELLED,
    Ending.CUT_AFTER_DONE: BreakCause.AFTER_DONE,
}

#: What the client's error event says, per upstream cause.
_CUT_MESSAGES = {
    BreakCause.UPSTREAM_RESET: "the upstream failed mid-response",
    BreakCause.UPSTREAM_TIMEOUT: "the upstream stopped sending mid-response",
}


class StreamBreaks:
    """``gtm_stream_breaks_total{tier,cause}`` on an injected registry, for one tier.

    A tier counts the breaks of its own upstream hop (and its clients' disconnects);
    every cause's series exists from the start, at 0.
    """

    def __init__(self, registry: CollectorRegistry, tier: Tier) -> None:
        counter = Counter(
            "gtm_stream_breaks",
            "Relayed responses that ended early after their first byte reached the client, "
            "by the tier whose upstream hop broke (or whose client left) and why.",
            ("tier", "cause"),
            registry=registry,
        )
        self._inc = {cause: counter.labels(tier.value, cause.value).inc for cause in BreakCause}

    def count(self, cause: BreakCause) -> None:
        self._inc[cause]()


class Upstream(Protocol):
    """An upstream's response: status and headers at once, the body as it arrives.

    ``readany`` raises :class:`~gtm.errors.UpstreamError` (or ``OSError``) when the
    response fails and ``TimeoutError`` when it is late; ``b""`` ends the body.
    ``release`` (body read to its end: reuse the connection) or ``close`` (abort) end it.
    ``body`` is the whole body when it arrived with the head and matches its
    ``Content-Length`` (the relay answers it at once, without a read), else ``None``;
    ``readany`` returns it all the same.
    """

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def fields(self) -> Sequence[tuple[str, str]] | None:
        """:attr:`headers`' fields in order, when the upstream holds them as a list
        (the relay reads them without iterating the mapping); None: it does not."""

    @property
    def content_length(self) -> int | None: ...

    @property
    def body(self) -> bytes | None: ...

    async def readany(self) -> bytes: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class Downstream(ABC):
    """The client's side of one relayed response, whichever server holds its connection.

    A response is either :meth:`whole` (status, headers and body in one write: the
    server sends it when the handler returns) or :meth:`start`-ed, :meth:`write`-n and
    ended with :meth:`write_eof`. ``write`` raises ``ConnectionResetError`` once the
    client has gone; :meth:`abort` resets the client's connection (a cut body must not
    look complete); :meth:`gone` says whether the client's connection is closing.
    """

    __slots__ = ()

    @abstractmethod
    def gone(self) -> bool:
        """Whether the client's connection is closed or closing."""

    @abstractmethod
    def whole(self, status: int, reason: str, headers: CIMultiDict[str], body: bytes) -> None:
        """The whole response (sent as the handler returns, in one write)."""

    @abstractmethod
    async def start(
        self, status: int, reason: str, headers: CIMultiDict[str], length: int | None
    ) -> None:
        """Send the status line and headers (``length``: the body's, else streamed)."""

    @abstractmethod
    async def write(self, data: bytes) -> None:
        """A body chunk (waits while the client's buffer is full)."""

    @abstractmethod
    async def write_eof(self) -> None:
        """The body's clean end."""

    @abstractmethod
    def abort(self) -> None:
        """Reset the client's connection."""


class AiohttpDownstream(Downstream):
    """aiohttp's server behind :class:`Downstream`; :meth:`result` is what the handler
    returns (a :meth:`whole` response is sent by aiohttp, after its prepare hooks)."""

    __slots__ = ("_request", "_response")

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._response: web.StreamResponse | None = None

    def result(self) -> web.StreamResponse:
        """The response the relay made (for the handler to return)."""
        if self._response is None:
            raise RuntimeError("no response was made")
        return self._response

    def gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    def whole(self, status: int, reason: str, headers: CIMultiDict[str], body: bytes) -> None:
        self._response = web.Response(status=status, reason=reason, headers=headers, body=body)

    async def start(
        self, status: int, reason: str, headers: CIMultiDict[str], length: int | None
    ) -> None:
        response = self._response = web.StreamResponse(
            status=status, reason=reason, headers=headers
        )
        if length is not None:
            response.content_length = length
        await response.prepare(self._request)

    async def write(self, data: bytes) -> None:
        await self.result().write(data)

    async def write_eof(self) -> None:
        await self.result().write_eof()

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.abort()


def skip_set(*names: str) -> frozenset[str]:
    """:data:`HOP_BY_HOP` and ``names`` (lower-cased): what a tier drops from the
    client's headers because it sets those itself. Build it once, at import."""
    return HOP_BY_HOP | {n.lower() for n in names}


def end_to_end(
    headers: Mapping[str, str],
    skip: frozenset[str] = HOP_BY_HOP,
    fields: Iterable[tuple[str, str]] | None = None,
) -> list[tuple[str, str]]:
    """The end-to-end headers of ``headers``: none in ``skip`` (a :func:`skip_set`) and
    none a ``Connection`` header names (RFC 9110 §7.6.1). ``fields``: ``headers``' own
    fields in order, when the caller has them as a list (read instead of its items)."""
    known = _known(skip)
    named = headers.get("connection")
    if named:
        listed = {token.strip().lower() for token in named.split(",")}
        if not listed <= skip:
            skip = skip | listed
            known = _UNKNOWN
    kept_as, dropped_as = known
    kept = []
    # (A loop, not a comprehension: no frame of its own.)
    for name, value in headers.items() if fields is None else fields:
        # A common spelling is judged by a set lookup, others lower-cased.
        if name in kept_as or (name not in dropped_as and name.lower() not in skip):
            kept.append((name, value))
    return kept


#: Common header names as clients and servers spell them (and each name of a skip set,
#: lower-case and capitalised): judged without ``lower()`` by :func:`end_to_end`.
_COMMON = (
    *("Host", "Content-Type", "Content-Length", "User-Agent", "Accept", "Accept-Encoding"),
    *("Authorization", "Connection", "Date", "Server", "X-Request-Id", "Traceparent"),
    *("Tracestate", "Cache-Control", "Transfer-Encoding", "Keep-Alive"),
)
_UNKNOWN: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())


@functools.lru_cache(maxsize=64)
def _known(skip: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """The spellings of :data:`_COMMON` and of ``skip``'s names that ``skip`` keeps, and
    those it drops (by the rule of :func:`end_to_end`, each once per skip set)."""
    names = {*_COMMON, *skip}
    spelled = {
        s for n in names for s in (n, n.lower(), "-".join(map(str.capitalize, n.split("-"))))
    }
    return (
        frozenset(s for s in spelled if s.lower() not in skip),
        frozenset(s for s in spelled if s.lower() in skip),
    )


T = TypeVar("T")


class RelayLoop(ABC, Generic[T]):
    """One request's trip upstream: subclass per tier, one instance per request.

    :meth:`run` runs the attempts, reading the request as ``scope`` (tracing's
    per-request state) and answering through ``downstream``; the hooks say what
    differs per tier:

    * :meth:`next_target` — where the next attempt goes (``None``: nowhere left);
    * :meth:`target_id` — the target's id (the tried set, messages, metrics);
    * :meth:`begin` — charge the target; returns the release, always called;
    * :meth:`open` — send the request: an :class:`Upstream` once its head arrived
      (any awaitable of one); :meth:`open_failed` — what an error before the head means;
    * :meth:`retry_status` — which statuses move on to the next target;
    * :meth:`first_byte_deadline` — a loop-time deadline for the first byte, or None;
    * :meth:`response_headers` — what the client's response gains (``x-gtm-*``);
    * :meth:`first_byte`, :meth:`failed`, :meth:`finished` — observations (metrics,
      passive health, audit); :meth:`chunk` — each relayed chunk, when
      :attr:`watch_chunks` (the regional LB reads the usage from them);
    * :meth:`exhausted` — the error the client gets when every attempt failed.
    """

    #: Attempts per request, first included.
    max_attempts: int = 3

    def __init__(
        self,
        scope: Scope,
        downstream: Downstream,
        *,
        max_attempts: int = 3,
        breaks: StreamBreaks | None = None,
    ) -> None:
        self.scope = scope
        self.downstream = downstream
        self.max_attempts = max_attempts
        #: Where breaks after the first byte are counted (None: not counted).
        self.breaks = breaks
        #: The failed attempts so far, in order.
        self.failures: list[AttemptFailed] = []

    # ------------------------------------------------------------------ hooks

    @abstractmethod
    def next_target(self, tried: frozenset[str]) -> T | None:
        """The next target not in ``tried`` (ids), or ``None``: no more attempts."""

    @abstractmethod
    def target_id(self, target: T) -> str:
        """The id of ``target`` (a GPU, zone or region id)."""

    @abstractmethod
    def open(self, target: T) -> Awaitable[Upstream]:
        """Send the request to ``target``; the upstream once the response head arrived
        (a coroutine, or any awaitable: the zone hands over its pool's own).

        Raises :class:`~gtm.errors.AttemptFailed` (translated library errors),
        :class:`~gtm.errors.UpstreamError` (see :meth:`open_failed`) or
        ``TimeoutError``."""

    @abstractmethod
    def exhausted(self) -> Exception:
        """The error for the client when no attempt succeeded (see :attr:`failures`)."""

    def begin(self, target: T) -> Callable[[], None] | None:
        """Called before an attempt (charge, count); returns the matching release."""
        return None

    def open_failed(self, error: UpstreamError | OSError) -> AttemptFailed:
        """The attempt's failure when :meth:`open` raised ``error`` before the response
        head (a tier whose client raises its own connect error says so here)."""
        return AttemptFailed(Failure.RESET, f"failed before the response: {error!r}")

    def retry_status(self, status: int) -> bool:
        """Whether a response with ``status`` moves on: 5xx and 429 (that target is at
        capacity). A tier whose 4xx answers are final overrides it."""
        return status >= 500 or status == 429

    def first_byte_deadline(self, target: T) -> float | None:
        """Event-loop time by which the first body byte must arrive (None: the
        upstream client's own timeouts only)."""
        return None

    def response_headers(self, target: T, headers: CIMultiDict[str]) -> None:
        """Add to (or override in) the client's response headers."""

    def first_byte(self, target: T) -> None:
        """The first body byte arrived (the client gets the status line next)."""

    def chunk(self, data: bytes) -> None:
        """A body chunk on its way to the client (set :attr:`watch_chunks` to get it)."""

    #: Whether :meth:`chunk` is called (the zone's path skips the call per chunk).
    watch_chunks: bool = False

    def failed(self, target: T, failure: AttemptFailed) -> None:
        """An attempt failed before its first byte (after its release ran)."""

    def finished(self, target: T, ending: Ending) -> None:
        """A relayed response ended (after its release ran)."""

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Try targets until one answers and relay its response to :attr:`downstream`;
        else raise :meth:`exhausted`.

        Each attempt is inline (one coroutine for the whole trip, not one per attempt
        and one per open): charge, open, the first byte, then the whole response in one
        write or :meth:`_relay`'s stream; its release and observations run in a
        ``finally`` before a failure is handled."""
        tried: frozenset[str] = frozenset()
        for _ in range(self.max_attempts):
            target = self.next_target(tried)
            if target is None:
                break
            try:
                release = self.begin(target)
                upstream: Upstream | None = None
                ending: Ending | None = None
                try:
                    deadline = self.first_byte_deadline(target)
                    first = b""
                    try:
                        if deadline is None:
                            # No deadline (every non-streamed request): no timeout to
                            # arm and disarm, no context manager to enter and leave.
                            upstream = await self.open(target)
                            retry = self.retry_status(upstream.status)
                            if not retry:
                                whole = upstream.body
                                first = await upstream.readany() if whole is None else whole
                        else:
                            async with asyncio.timeout_at(deadline):
                                upstream = await self.open(target)
                                retry = self.retry_status(upstream.status)
                                if not retry:
                                    whole = upstream.body
                                    first = await upstream.readany() if whole is None else whole
                    except TimeoutError:
                        late = "no response headers" if upstream is None else "no first byte"
                        raise AttemptFailed(Failure.TIMEOUT, f"{late} in time") from None
                    except (UpstreamError, OSError) as exc:
                        if upstream is None:
                            raise self.open_failed(exc) from None
                        raise AttemptFailed(
                            Failure.RESET, f"failed before the first byte: {exc!r}"
                        ) from None
                    if retry:
                        status = upstream.status
                        body = await bounded_body(upstream)
                        raise AttemptFailed(
                            Failure.STATUS, f"HTTP {status}", status=status, body=body
                        )
                    self.first_byte(target)
                    headers = CIMultiDict(end_to_end(upstream.headers, HOP_BY_HOP, upstream.fields))
                    self.response_headers(target, headers)
                    length = upstream.content_length
                    if length is not None and len(first) == length:
                        # The whole body came with the head or in one read: one
                        # response, one write, no stream.
                        if self.watch_chunks:
                            self.chunk(first)
                        self.downstream.whole(upstream.status, upstream.reason, headers, first)
                        ending = Ending.COMPLETED
                        return
                    try:
                        ending = await self._relay(target, upstream, first, headers, length)
                    except asyncio.CancelledError:
                        # After the first byte: the client left (the server cancels the
                        # handler), or the server is stopping with the client still there.
                        ending = Ending.CLIENT_GONE if self.downstream.gone() else Ending.CANCELLED
                        _log_break(self.target_id(target), ending, None)
                        raise
                finally:
                    if upstream is not None:
                        if ending is Ending.COMPLETED:
                            upstream.release()  # read to its end: the connection is reused
                        else:
                            upstream.close()  # the target sees the disconnect and aborts
                    if release is not None:
                        release()
                    if ending is not None:
                        if ending is not Ending.COMPLETED and self.breaks is not None:
                            cause = ending.cause
                            if cause is not None:
                                self.breaks.count(cause)
                        self.finished(target, ending)
                return
            except AttemptFailed as failure:
                # (The target's id is only needed once an attempt failed: for the
                # tried set, the failure and its trace.)
                target_id = self.target_id(target)
                tried = tried | {target_id}
                failure.target = target_id
                self.failures.append(failure)
                tracing.attempt_failed(
                    self.scope, target_id, failure.kind, failure.status, failure.detail
                )
                self.failed(target, failure)
        raise self.exhausted()

    async def _relay(
        self,
        target: T,
        upstream: Upstream,
        first: bytes,
        headers: CIMultiDict[str],
        length: int | None,
    ) -> Ending:
        """Stream the response whose head and first bytes came (not whole in ``first``)."""
        watch = self.watch_chunks
        client = self.downstream
        await client.start(upstream.status, upstream.reason, headers, length)
        last = b""
        ending = Ending.COMPLETED
        error: BaseException | None = None
        try:
            chunk = first
            while chunk:
                if watch:
                    self.chunk(chunk)
                await client.write(chunk)
                last = chunk
                try:
                    chunk = await upstream.readany()
                except TimeoutError as exc:
                    ending, error = Ending.CUT_TIMEOUT, exc
                    break
                except (UpstreamError, OSError) as exc:
                    ending, error = Ending.CUT_RESET, exc
                    break
            else:
                await client.write_eof()
                return Ending.COMPLETED
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            _log_break(self.target_id(target), Ending.CLIENT_GONE, exc)
            return Ending.CLIENT_GONE
        sse = is_event_stream(upstream.headers)
        if sse and last.rstrip().endswith(b"[DONE]"):
            ending = Ending.CUT_AFTER_DONE
        _log_break(self.target_id(target), ending, error)
        await _cut(client, ending, sse=sse, last=last)
        return ending


class Relay(RelayLoop[T]):
    """The relay loop bound to an aiohttp request (the front door, the regional LB):
    :attr:`request` for the hooks, :meth:`forward` for the handler."""

    def __init__(
        self,
        request: web.Request,
        *,
        max_attempts: int = 3,
        breaks: StreamBreaks | None = None,
    ) -> None:
        self._client = AiohttpDownstream(request)
        super().__init__(request, self._client, max_attempts=max_attempts, breaks=breaks)
        self.request = request

    async def forward(self) -> web.StreamResponse:
        """Try targets until one answers and relay its response; else raise
        :meth:`exhausted`."""
        await self.run()
        return self._client.result()


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether a response is a server-sent event stream (``text/event-stream``)."""
    kind = headers.get("content-type", "")
    return kind.split(";", 1)[0].strip().lower() == "text/event-stream"


def cut_event(cause: BreakCause) -> bytes:
    """The SSE event a streaming client gets when its stream broke upstream: OpenAI's
    error shape (``{"error": {"message", "type", "param", "code"}}``), ``code`` the
    cause, so the OpenAI SDKs raise it as an ``APIError`` and no ``[DONE]`` follows."""
    what = _CUT_MESSAGES.get(cause, "the response was cut")
    error = ApiError(
        502,
        f"{what}; the answer is incomplete (retry the request)",
        type=ErrorType.SERVER,
        code=cause.value,
    )
    return b"data: " + json.dumps(error.body(), separators=(",", ":")).encode() + b"\n\n"


def _at_event_boundary(last: bytes) -> bool:
    return last.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))


async def _cut(client: Downstream, ending: Ending, *, sse: bool, last: bytes) -> None:
    """End a response whose upstream broke after the first byte, so the client can tell.

    An event stream gets :func:`cut_event` (after a blank line when the upstream broke
    inside an event, so the error is an event of its own) and a clean end; anything else
    has its connection reset: a ``Content-Length`` the body never reaches, or no last
    chunk, is what an HTTP client detects.
    """
    cause = ending.cause
    if sse and cause is not None:
        event = b"" if cause is BreakCause.AFTER_DONE else cut_event(cause)
        if event and not _at_event_boundary(last):
            event = b"\n\n" + event
        try:
            if event:
                await client.write(event)
            await client.write_eof()
            return
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass  # the client left meanwhile: nothing more to tell it
    client.abort()


def _log_break(target: str, ending: Ending, error: BaseException | None) -> None:
    """One line per break, at its level: an upstream break is a WARNING; one after the
    answer's ``[DONE]`` is INFO (the client has it all); a client that left (or a server
    stopping) is DEBUG — no product failure. Never a traceback."""
    cause = ending.cause
    detail = (f"{type(error).__name__}: {error}" if error is not None else "").rstrip(": ")
    if cause is BreakCause.UPSTREAM_RESET or cause is BreakCause.UPSTREAM_TIMEOUT:
        log.warning(
            "stream from %s broke after the first byte (%s: %s); the client was told",
            target,
            cause,
            detail or "no detail",
        )
    elif cause is BreakCause.AFTER_DONE:
        log.info(
            "stream from %s broke after its [DONE] (%s); the client has the whole answer",
            target,
            detail or "no detail",
        )
    else:
        log.debug("stream from %s ended after the first byte: %s", target, cause)


async def bounded_body(upstream: Upstream, limit: int = ERROR_BODY_BYTES) -> bytes:
    """Up to ``limit`` bytes of a (retried) response's body, for its message; ``b""``
    when it does not come within :data:`ERROR_BODY_WAIT_S`."""

    async def read() -> bytes:
        out = bytearray()
        while len(out) < limit:
            chunk = await upstream.readany()
            if not chunk:
                break
            out += chunk
        return bytes(out[:limit])

    try:
        return await asyncio.wait_for(read(), ERROR_BODY_WAIT_S)
    except (TimeoutError, UpstreamError, OSError):
        return b""


def describe(failures: Sequence[AttemptFailed], kind: Callable[[str], str] = str) -> str:
    """``"<kind(target)>: <detail>; …"`` for an error message."""
    return "; ".join(f"{kind(f.target)}: {f.detail}" for f in failures)


def all_busy(failures: Sequence[AttemptFailed]) -> bool:
    """Whether every attempt was refused for capacity (429 or 503)."""
    return bool(failures) and all(f.status in (429, 503) for f in failures)


# ---------------------------------------------------------------------------- aiohttp


class AiohttpUpstream:
    """An aiohttp ``ClientResponse`` behind :class:`Upstream` (errors translated)."""

    __slots__ = ("_response", "content_length", "headers", "reason", "status")

    #: aiohttp's body is always read (see :class:`Upstream`).
    body: bytes | None = None
    #: Its headers are a mapping only.
    fields: Sequence[tuple[str, str]] | None = None

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status: int = response.status
        self.reason: str = response.reason or ""
        self.headers: Mapping[str, str] = response.headers
        self.content_length: int | None = response.content_length

    async def readany(self) -> bytes:
        try:
            return await self._response.content.readany()
        except TimeoutError:
            raise  # aiohttp's read timeout is a ClientError too: keep it a timeout
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc

    def release(self) -> None:
        self._response.release()

    def close(self) -> None:
        self._response.close()


async def open_aiohttp(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Iterable[tuple[str, str]],
    timeouts: aiohttp.ClientTimeout,
) -> AiohttpUpstream:
    """``POST`` over ``session``; the response once its head arrived. Raises
    :class:`~gtm.errors.AttemptFailed` (connect, timeout, reset)."""
    try:
        response = await session.post(url, data=body, headers=list(headers), timeout=timeouts)
    except aiohttp.ClientConnectorError as exc:
        raise AttemptFailed(Failure.CONNECT, f"connect failed: {exc.os_error}") from None
    except TimeoutError:
        raise AttemptFailed(Failure.TIMEOUT, "no response headers in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise AttemptFailed(Failure.RESET, f"failed before the response: {exc!r}") from None
    return AiohttpUpstream(response)


def first_byte_timeout(connect_s: float, first_byte_s: float) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for a relay: connect, then every read (the first byte
    included) within ``first_byte_s``; no total (a stream may last minutes)."""
    return aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=first_byte_s)


__all__ = [
    "ERROR_BODY_BYTES",
    "HOP_BY_HOP",
    "AiohttpDownstream",
    "AiohttpUpstream",
    "BreakCause",
    "Downstream",
    "Ending",
    "Failure",
    "Relay",
    "RelayLoop",
    "StreamBreaks",
    "Upstream",
    "all_busy",
    "bounded_body",
    "cut_event",
    "describe",
    "end_to_end",
    "first_byte_timeout",
    "is_event_stream",
    "open_aiohttp",
    "skip_set",
]

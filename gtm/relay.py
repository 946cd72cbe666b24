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
  or decompressed. A body that arrives whole in the first read (``Content-Length``
  met) is answered as one response, so headers and body leave in one write.
* **After the first byte** a failure cannot be retried: the client's connection is
  cut (an SSE client sees no ``[DONE]``), so a partial answer never looks complete.
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
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from gtm.errors import AttemptFailed, UpstreamError

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


class Upstream(Protocol):
    """An upstream's response: status and headers at once, the body as it arrives.

    ``readany`` raises :class:`~gtm.errors.UpstreamError` (or ``OSError``) when the
    response fails and ``TimeoutError`` when it is late; ``b""`` ends the body.
    ``release`` (body read to its end: reuse the connection) or ``close`` (abort) end it.
    """

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content_length(self) -> int | None: ...

    async def readany(self) -> bytes: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


def skip_set(*names: str) -> frozenset[str]:
    """:data:`HOP_BY_HOP` and ``names`` (lower-cased): what a tier drops from the
    client's headers because it sets those itself. Build it once, at import."""
    return HOP_BY_HOP | {n.lower() for n in names}


def end_to_end(
    headers: Mapping[str, str], skip: frozenset[str] = HOP_BY_HOP
) -> list[tuple[str, str]]:
    """The end-to-end headers of ``headers``: none in ``skip`` (a :func:`skip_set`) and
    none a ``Connection`` header names (RFC 9110 §7.6.1)."""
    named = headers.get("connection")
    if named:
        listed = {token.strip().lower() for token in named.split(",")}
        if not listed <= skip:
            skip = skip | listed
    return [(k, v) for k, v in headers.items() if k.lower() not in skip]


T = TypeVar("T")


class Relay(ABC, Generic[T]):
    """One request's trip upstream: subclass per tier, one instance per request.

    :meth:`forward` runs the attempts; the hooks say what differs per tier:

    * :meth:`next_target` — where the next attempt goes (``None``: nowhere left);
    * :meth:`target_id` — the target's id (the tried set, messages, metrics);
    * :meth:`begin` — charge the target; returns the release, always called;
    * :meth:`open` — send the request: an :class:`Upstream` once its head arrived;
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

    def __init__(self, request: web.Request, *, max_attempts: int = 3) -> None:
        self.request = request
        self.max_attempts = max_attempts
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
    async def open(self, target: T) -> Upstream:
        """Send the request to ``target``; return once the response head arrived.

        Raises :class:`~gtm.errors.AttemptFailed` (translated library errors) or
        ``TimeoutError``."""

    @abstractmethod
    def exhausted(self) -> Exception:
        """The error for the client when no attempt succeeded (see :attr:`failures`)."""

    def begin(self, target: T) -> Callable[[], None] | None:
        """Called before an attempt (charge, count); returns the matching release."""
        return None

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

    async def forward(self) -> web.StreamResponse:
        """Try targets until one answers and relay its response; else raise
        :meth:`exhausted`."""
        tried: set[str] = set()
        for _ in range(self.max_attempts):
            target = self.next_target(frozenset(tried))
            if target is None:
                break
            target_id = self.target_id(target)
            tried.add(target_id)
            try:
                return await self._attempt(target)
            except AttemptFailed as failure:
                failure.target = target_id
                self.failures.append(failure)
                self.failed(target, failure)
        raise self.exhausted()

    async def _attempt(self, target: T) -> web.StreamResponse:
        release = self.begin(target)
        upstream: Upstream | None = None
        ending: Ending | None = None
        try:
            deadline = self.first_byte_deadline(target)
            first = b""
            try:
                async with asyncio.timeout_at(deadline):
                    upstream = await self.open(target)
                    retry = self.retry_status(upstream.status)
                    if not retry:
                        first = await upstream.readany()
            except TimeoutError:
                late = "no response headers" if upstream is None else "no first byte"
                raise AttemptFailed(Failure.TIMEOUT, f"{late} in time") from None
            except (UpstreamError, OSError) as exc:
                where = "the response" if upstream is None else "the first byte"
                raise AttemptFailed(Failure.RESET, f"failed before {where}: {exc!r}") from None
            if retry:
                status = upstream.status
                body = await bounded_body(upstream)
                raise AttemptFailed(Failure.STATUS, f"HTTP {status}", status=status, body=body)
            response, ending = await self._relay(target, upstream, first)
            return response
        finally:
            if upstream is not None:
                if ending is Ending.COMPLETED:
                    upstream.release()  # read to its end: the connection is reused
                else:
                    upstream.close()  # the target sees the disconnect and aborts
            if release is not None:
                release()
            if ending is not None:
                self.finished(target, ending)

    async def _relay(
        self, target: T, upstream: Upstream, first: bytes
    ) -> tuple[web.StreamResponse, Ending]:
        self.first_byte(target)
        headers = CIMultiDict(end_to_end(upstream.headers))
        self.response_headers(target, headers)
        length = upstream.content_length
        watch = self.watch_chunks
        if length is not None and len(first) == length:
            # The whole body came in one read: one response, one write.
            if watch:
                self.chunk(first)
            whole = web.Response(
                status=upstream.status, reason=upstream.reason, headers=headers, body=first
            )
            return whole, Ending.COMPLETED
        request = self.request
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=headers
        )
        if length is not None:
            response.content_length = length
        await response.prepare(request)
        try:
            chunk = first
            while chunk:
                if watch:
                    self.chunk(chunk)
                await response.write(chunk)
                try:
                    chunk = await upstream.readany()
                except TimeoutError:
                    return _cut(request, response, self.target_id(target)), Ending.CUT_TIMEOUT
                except (UpstreamError, OSError):
                    return _cut(request, response, self.target_id(target)), Ending.CUT_RESET
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return response, Ending.CLIENT_GONE
        return response, Ending.COMPLETED


def _cut(request: web.Request, response: web.StreamResponse, target: str) -> web.StreamResponse:
    """The upstream failed mid-response: reset the client's connection (no clean end)."""
    log.warning("upstream %s failed mid-response; cutting the client", target)
    transport = request.transport
    if transport is not None:
        transport.abort()
    return response


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
    "AiohttpUpstream",
    "Ending",
    "Failure",
    "Relay",
    "Upstream",
    "all_busy",
    "bounded_body",
    "describe",
    "end_to_end",
    "first_byte_timeout",
    "open_aiohttp",
    "skip_set",
]

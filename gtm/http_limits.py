"""Input hardening shared by every gtm HTTP server (front door, regional LB, zone agent,
emulator, status page, fault proxy).

:func:`limited_app` builds an :class:`aiohttp.web.Application` whose first middleware
enforces :class:`HttpLimits`, and whose connection handler gets the matching parser
limits and timeouts (``handler_args``), so a server opts in where its app is built:

============================  ========  =============================================
limit                         answer    how
============================  ========  =============================================
header count / size           431       counted on the parsed headers (RFC 6585 §5);
                                        past the parser's hard ceiling (2× the count,
                                        ``max_header_bytes`` per line) aiohttp answers
                                        400 before any gtm code runs
body size                     413       ``Content-Length`` checked before reading; a
                                        chunked body is cut at the limit while read
JSON nesting depth            400       scanned before parsing (:func:`json_too_deep`)
slow headers (slowloris)      closed    the connection's idle/header timer:
                                        ``header_timeout_s`` from connect or from the
                                        end of the previous response until a complete
                                        header block
slow body                     408       the whole body within ``body_timeout_s``; the
                                        connection is closed after ``lingering_s``
concurrency per client        429       in-flight requests per peer address, with
                                        ``Retry-After``
============================  ========  =============================================

Every refusal is JSON in the OpenAI error shape (:mod:`gtm.openai_errors`) and closes
the connection when the request's body was not read (its bytes would otherwise be
parsed as the next request).

The rules are functions over a request's facts (:func:`header_problem`,
:func:`body_too_large`, :func:`body_too_slow`, :func:`body_too_deep`, :class:`ClientSlots`),
so aiohttp's middleware and the lean server (:mod:`gtm.http1`) apply the same ones; the
application keeps its :class:`ServerLimits` (limits, body bound, the per-client counts)
under :data:`LIMITS_KEY`, so both servers of one listener share the per-client counts.

Defaults, and why. 100 headers and 8190 bytes per header line are Apache httpd's
``LimitRequestFields`` / ``LimitRequestFieldSize`` defaults (and aiohttp's line limit);
32 KiB of headers in all is nginx's ``large_client_header_buffers 4 8k``. A 20 s header
timeout is Apache ``mod_reqtimeout``'s first header stage (``header=20-40``) and stays
above aiohttp's client keep-alive (15 s), so pooled inter-tier connections are closed by
the client side first and never raced. 64 levels of JSON is far above any OpenAI request
(chat messages with tool calls nest under 10) and far below CPython's recursion limit.
1024 concurrent requests per address: tiers talk to each other over few addresses (all
of a front door's traffic to a region comes from one), so the bound stops one client
from taking every slot without throttling a tier; lower it at an internet-facing door.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import Field

from gtm.models import Frozen
from gtm.openai_errors import ApiError, BadRequest, ErrorType

#: Deepest JSON nesting accepted by :func:`gtm.openai_request.parse_json_body`.
MAX_JSON_DEPTH = 64

# A JSON string (escapes included; the unrolled form is linear, no backtracking) or a
# bracket. Strings are matched only so that brackets inside them are skipped.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_OPEN = frozenset(b"[{")


def json_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``raw`` nests arrays/objects deeper than ``limit``, found by a scan that
    does not recurse (so it is safe on any input, before ``json.loads``)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # the common case: cannot be deeper than the number of openers
    depth = 0
    for match in _JSON_TOKEN.finditer(raw):
        first = match.group()[0]
        if first in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif first != 0x22:  # a closing bracket ('"' starts a skipped string)
            depth = max(0, depth - 1)
    return False


class HttpLimits(Frozen):
    """Per-server input limits; see the module docstring for the defaults' sources."""

    max_headers: int = Field(default=100, ge=8, le=10_000)
    max_header_line_bytes: int = Field(default=8190, ge=256, le=1 << 20)
    max_header_bytes: int = Field(default=32 << 10, ge=1024, le=1 << 22)
    max_json_depth: int = Field(default=MAX_JSON_DEPTH, ge=2, le=512)
    header_timeout_s: float = Field(default=20.0, gt=0.0, le=3600.0)
    body_timeout_s: float = Field(default=30.0, gt=0.0, le=3600.0)
    #: In-flight requests per client address; 0 turns the bound off.
    max_concurrent_per_client: int = Field(default=1024, ge=0)
    retry_after_s: float = Field(default=1.0, gt=0.0)
    #: After refusing a request whose body was not read, how long the rest of the body
    #: is read and dropped before closing, so the client sees the answer rather than a
    #: reset (aiohttp's default is 10 s; a slow sender should not hold a slot that long).
    lingering_s: float = Field(default=2.0, ge=0.0, le=60.0)

    def handler_args(self) -> dict[str, Any]:
        """aiohttp connection-handler settings: the parser's hard ceilings (above the
        limits the middleware answers 431 for) and the header (keep-alive) timer."""
        return {
            "max_headers": self.max_headers * 2,
            "max_field_size": self.max_header_bytes,
            "keepalive_timeout": self.header_timeout_s,
            "lingering_time": self.lingering_s,
        }


def _refuse(error: ApiError) -> web.Response:
    response = error.response()
    response.force_close()
    return response


def header_problem(raw_headers: Sequence[tuple[bytes, bytes]], limits: HttpLimits) -> str | None:
    """Why a request's header fields are over ``limits`` (count, a line, the total), or
    None; the answer is :func:`headers_too_large`."""
    if len(raw_headers) > limits.max_headers:
        return f"{len(raw_headers)} header fields; at most {limits.max_headers} are accepted"
    total = 0
    for name, value in raw_headers:
        line = len(name) + len(value) + 4  # "name: value\r\n"
        if line > limits.max_header_line_bytes:
            shown = name[:64].decode("latin-1")
            return (
                f"header field {shown!r} is {line} bytes; at most "
                f"{limits.max_header_line_bytes} are accepted"
            )
        total += line
    if total > limits.max_header_bytes:
        return f"{total} bytes of header fields; at most {limits.max_header_bytes} are accepted"
    return None


def fields_fit(limits: HttpLimits) -> int:
    """The head size (its bytes plus one per field) up to which no field line nor their
    total can be over ``limits``, so :func:`header_problem` need not scan the fields
    (only their count): a field's line as counted there is at most its bytes in the
    head plus one (a value without the space after its colon)."""
    return min(limits.max_header_line_bytes, limits.max_header_bytes)


def headers_too_large(problem: str) -> ApiError:
    """431 for a :func:`header_problem` (the connection is then closed)."""
    return ApiError(431, f"request header fields too large: {problem}", code="headers_too_large")


def body_too_large(length: int | None, max_body_bytes: int) -> ApiError:
    """413: a body of ``length`` bytes (None: found over the bound while read)."""
    if length is None:
        return ApiError(413, f"request body is over {max_body_bytes} bytes", code="body_too_large")
    return ApiError(
        413, f"request body is {length} bytes; at most {max_body_bytes}", code="body_too_large"
    )


def body_too_slow(limits: HttpLimits) -> ApiError:
    """408: the body did not arrive within ``body_timeout_s``."""
    return ApiError(
        408, f"request body not received within {limits.body_timeout_s:g} s", code="body_timeout"
    )


def body_too_deep(raw: bytes, limits: HttpLimits) -> ApiError | None:
    """400 when a JSON body nests deeper than ``max_json_depth`` (scanned, not parsed)."""
    depth = limits.max_json_depth
    if raw.lstrip()[:1] in (b"{", b"[") and json_too_deep(raw, depth):
        return BadRequest(
            f"the request body is nested too deeply (over {limits.max_json_depth} levels)",
            code="invalid_json",
        )
    return None


class ClientSlots:
    """In-flight requests per client address, bounded by ``max_concurrent_per_client``
    (0: unbounded). :meth:`take` is a 429 refusal or None (then :meth:`give` back)."""

    __slots__ = ("_limits", "cap", "in_flight")

    def __init__(self, limits: HttpLimits) -> None:
        self._limits = limits
        #: The bound (0: none).
        self.cap = limits.max_concurrent_per_client
        #: In-flight requests by client address (only addresses with some).
        self.in_flight: dict[str, int] = {}

    def take(self, peer: str) -> ApiError | None:
        active = self.in_flight.get(peer, 0)
        cap = self.cap
        if cap and active >= cap:
            return self.refusal(peer)
        self.in_flight[peer] = active + 1
        return None

    def refusal(self, peer: str) -> ApiError:
        """The 429 for ``peer``, at the bound."""
        return ApiError(
            429,
            f"too many concurrent requests from {peer} (at most {self.cap}); retry later",
            type=ErrorType.RATE_LIMIT,
            code="client_concurrency",
            retry_after_s=self._limits.retry_after_s,
        )

    def give(self, peer: str) -> None:
        remaining = self.in_flight[peer] - 1
        if remaining:
            self.in_flight[peer] = remaining
        else:
            del self.in_flight[peer]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """One listener's limits as both of its servers apply them."""

    limits: HttpLimits
    max_body_bytes: int
    slots: ClientSlots = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", ClientSlots(self.limits))


#: Where :func:`limited_app` keeps its :class:`ServerLimits`.
LIMITS_KEY = web.AppKey("gtm_http_limits", ServerLimits)


def limits_middleware(
    limits: HttpLimits, *, max_body_bytes: int, server: ServerLimits | None = None
) -> Middleware:
    """The middleware of :func:`limited_app` (first in the chain); ``server``: the
    listener's limits when another server shares its per-client counts."""
    server = server or ServerLimits(limits, max_body_bytes)
    slots = server.slots

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        problem = header_problem(request.raw_headers, limits)
        if problem is not None:
            return _refuse(headers_too_large(problem))
        peer = request.remote or "-"
        refused = slots.take(peer)
        if refused is not None:
            return refused.response()
        try:
            refusal = await _read_body(request, limits, max_body_bytes)
            if refusal is not None:
                return refusal
            return await handler(request)
        finally:
            slots.give(peer)

    return limit


async def _read_body(
    request: web.Request, limits: HttpLimits, max_body_bytes: int
) -> web.Response | None:
    """Read the whole body now (handlers then get it from aiohttp's cache), bounded in
    size and time; check its JSON depth. A refusal, or None."""
    if not request.body_exists:
        return None
    length = request.content_length
    if length is not None and length > max_body_bytes:
        return _refuse(body_too_large(length, max_body_bytes))
    try:
        if request.content.is_eof():  # all of it arrived with the head: nothing to bound
            raw = await request.read()
        else:
            async with asyncio.timeout(limits.body_timeout_s):
                raw = await request.read()
    except TimeoutError:
        return _refuse(body_too_slow(limits))
    except web.HTTPRequestEntityTooLarge:
        return _refuse(body_too_large(None, max_body_bytes))
    deep = body_too_deep(raw, limits)
    return None if deep is None else deep.response()


def limited_app(
    limits: HttpLimits,
    *,
    client_max_size: int,
    middlewares: Iterable[Middleware] = (),
) -> web.Application:
    """An application with ``limits`` applied (their middleware first); its
    :class:`ServerLimits` under :data:`LIMITS_KEY`."""
    server = ServerLimits(limits, client_max_size)
    app = web.Application(
        client_max_size=client_max_size,
        middlewares=[
            limits_middleware(limits, max_body_bytes=client_max_size, server=server),
            *middlewares,
        ],
        handler_args=limits.handler_args(),
    )
    app[LIMITS_KEY] = server
    return app

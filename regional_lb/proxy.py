"""The data path: forward a request to a zone agent or a peer region's LB, stream back.

* **Streaming**: the response is relayed chunk by chunk as it arrives (``iter_any``),
  never buffered, with ``auto_decompress`` off so the bytes are the upstream's own.
* **Retries** only before the first byte reaches the client, to a target not tried yet,
  at most ``max_attempts`` (3, ARCHITECTURE §6) in all: on a connect failure, a timeout
  or reset before the first byte, a 5xx, or a 429 (that zone's queue is full). Once the
  client has the status line, a failure cuts the client's connection (an SSE client sees
  no ``[DONE]``): a partial answer must not look complete.
* **Cancellation**: when the client goes away aiohttp cancels the handler; the upstream
  response is closed (the zone agent sees the disconnect and aborts the request) and
  the caller's ``finally`` releases its quota ticket and accounting.
* **Usage**: :class:`UsageTap` watches the relayed bytes for the OpenAI ``usage`` object
  (a JSON body, or the last SSE chunk when the client asked for it) and otherwise counts
  streamed content chunks, so quotas and VTC counters can be reconciled with what the
  request really produced.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from regional_lb.errors import Overloaded, UpstreamFailed
from regional_lb.metrics import RegionalMetrics
from regional_lb.quota import Usage

log = logging.getLogger(__name__)

#: Hop-by-hop headers (RFC 9110 §7.6.1) and those the proxy recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
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
#: Bytes of a non-streamed body kept to read its ``usage`` (larger bodies are relayed
#: but not parsed: their usage is unknown and the estimate stands).
USAGE_BODY_BYTES = 1 << 20
_ERROR_BODY_BYTES = 4096
#: Retry-After of a 503 when every target tried was at capacity.
BUSY_RETRY_AFTER_S = 1.0


class TargetKind(StrEnum):
    ZONE = "zone"
    PEER = "peer"


@dataclass(frozen=True, slots=True)
class Target:
    """Where one attempt goes: a zone agent or a peer region's regional LB."""

    id: str
    url: str
    kind: TargetKind
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProxySettings:
    max_attempts: int = 3
    connect_timeout_s: float = 2.0
    #: Longest wait for the first response byte (a long prompt's prefill, or a queue).
    first_byte_timeout_s: float = 120.0


class UsageTap:
    """Reads the usage of a response from the bytes relayed (bounded work and memory)."""

    def __init__(self, streaming: bool) -> None:
        self._streaming = streaming
        self._body = bytearray()
        self._line = bytearray()
        self._chunks = 0
        self._usage: Usage | None = None
        self._overflow = False
        self.relayed_any = False

    def feed(self, data: bytes) -> None:
        self.relayed_any = True
        if not self._streaming:
            if len(self._body) + len(data) > USAGE_BODY_BYTES:
                self._overflow = True
            else:
                self._body += data
            return
        self._line += data
        while (cut := self._line.find(b"\n")) >= 0:
            line = bytes(self._line[:cut]).strip()
            del self._line[: cut + 1]
            self._sse_line(line)
        if len(self._line) > USAGE_BODY_BYTES:
            self._line.clear()

    def _sse_line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        if b'"usage"' in payload:
            found = _usage_of(payload)
            if found is not None:
                self._usage = found
                return
        if b'"choices"' in payload and b'"choices":[]' not in payload.replace(b" ", b""):
            self._chunks += 1

    def usage(self, input_tokens: int) -> Usage | None:
        """The reported usage; else (streams) ``input_tokens`` and one token per chunk."""
        if self._usage is not None:
            return self._usage
        if not self._streaming:
            return None if self._overflow else _usage_of(bytes(self._body))
        return Usage(input_tokens, self._chunks) if self._chunks else None


def _usage_of(payload: bytes) -> Usage | None:
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(max(0, prompt), max(0, completion))


class _Retry(Exception):
    """An attempt failed before the first byte; try another target."""

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status


@dataclass(slots=True)
class Relayed:
    """What happened to a relayed response."""

    target: Target
    status: int
    completed: bool = False
    client_gone: bool = False


def forward_headers(request: web.Request, extra: Mapping[str, str]) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict(
        (k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP
    )
    for name, value in extra.items():
        headers[name] = value
    return headers


class Forwarder:
    """Sends requests upstream over a keep-alive pool and relays the answers."""

    def __init__(
        self,
        session: Callable[[], aiohttp.ClientSession],
        metrics: RegionalMetrics,
        settings: ProxySettings | None = None,
    ) -> None:
        self._session = session
        self._metrics = metrics
        self._settings = settings or ProxySettings()

    @property
    def settings(self) -> ProxySettings:
        return self._settings

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        *,
        next_target: Callable[[frozenset[str]], Target | None],
        start: Callable[[Target], Callable[[], None]],
        response_headers: Callable[[Target], Mapping[str, str]],
        tap: UsageTap,
        arrived: float,
    ) -> tuple[web.StreamResponse, Relayed]:
        """Try targets until one answers; relay its response.

        ``next_target(tried)`` gives the next target (``None``: no more); ``start`` is
        called before each attempt and returns the matching release (always called).
        Raises :class:`UpstreamFailed` / :class:`Overloaded` when every attempt failed.
        """
        tried: set[str] = set()
        failures: list[str] = []
        statuses: list[int | None] = []
        for _ in range(self._settings.max_attempts):
            target = next_target(frozenset(tried))
            if target is None:
                break
            tried.add(target.id)
            release = start(target)
            try:
                return await self._attempt(
                    request, body, target, response_headers(target), tap, arrived
                )
            except _Retry as retry:
                failures.append(f"{target.kind} {target.id}: {retry.detail}")
                statuses.append(retry.status)
                self._metrics.upstream.labels(target.id, retry.reason).inc()
            finally:
                release()
        detail = "; ".join(failures) or "no zone or peer region to send it to"
        if statuses and all(s in (429, 503) for s in statuses):
            raise Overloaded(
                f"every target tried is at capacity ({detail})",
                reason="upstream_busy",
                retry_after_s=BUSY_RETRY_AFTER_S,
            )
        raise UpstreamFailed(f"the request failed before any response: {detail}")

    async def _attempt(
        self,
        request: web.Request,
        body: bytes,
        target: Target,
        extra_headers: Mapping[str, str],
        tap: UsageTap,
        arrived: float,
    ) -> tuple[web.StreamResponse, Relayed]:
        settings = self._settings
        timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout_s, sock_read=settings.first_byte_timeout_s
        )
        upstream: aiohttp.ClientResponse | None = None
        relayed: Relayed | None = None
        try:
            try:
                upstream = await self._session().post(
                    target.url + request.path_qs,
                    data=body,
                    headers=forward_headers(request, target.headers),
                    timeout=timeout,
                )
            except aiohttp.ClientConnectorError as exc:
                raise _Retry("connect", f"connect failed: {exc.os_error}") from None
            except TimeoutError:
                raise _Retry("timeout", "no response headers in time") from None
            except (aiohttp.ClientError, OSError) as exc:
                raise _Retry("reset", f"failed before the response: {exc!r}") from None
            if upstream.status >= 500 or upstream.status == 429:
                detail = (await _bounded_body(upstream)).decode("utf-8", "replace")[:300]
                raise _Retry(
                    f"http_{upstream.status}", f"HTTP {upstream.status} {detail}", upstream.status
                )
            response, relayed = await self._relay(
                request, upstream, target, extra_headers, tap, arrived
            )
            self._metrics.upstream.labels(target.id, "ok" if relayed.completed else "cut").inc()
            return response, relayed
        finally:
            if upstream is not None:
                if relayed is not None and relayed.completed:
                    upstream.release()
                else:
                    upstream.close()

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        target: Target,
        extra_headers: Mapping[str, str],
        tap: UsageTap,
        arrived: float,
    ) -> tuple[web.StreamResponse, Relayed]:
        """The first chunk is read *before* the client gets the status line, so a target
        that fails between its headers and its first byte is still retried."""
        try:
            first = await upstream.content.readany()
        except TimeoutError:
            raise _Retry("timeout", "no first byte in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise _Retry("reset", f"failed before the first byte: {exc!r}") from None
        self._metrics.first_byte.observe(max(0.0, time.perf_counter() - arrived))
        headers: CIMultiDict[str] = CIMultiDict(
            (k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
        )
        for name, value in extra_headers.items():
            headers.setdefault(name, value)
        response = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=headers
        )
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        relayed = Relayed(target, upstream.status)
        await response.prepare(request)
        try:
            chunk = first
            while chunk:
                tap.feed(chunk)
                await response.write(chunk)
                try:
                    chunk = await upstream.content.readany()
                except (TimeoutError, aiohttp.ClientError, OSError):
                    log.warning(
                        "%s %s failed mid-response; cutting the client", target.kind, target.id
                    )
                    _cut(request)
                    return response, relayed
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            relayed.client_gone = True
            return response, relayed
        relayed.completed = True
        return response, relayed


def _cut(request: web.Request) -> None:
    """The upstream failed mid-response: reset the client's connection (no clean end)."""
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _bounded_body(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await asyncio.wait_for(response.content.read(_ERROR_BODY_BYTES), 5.0)
    except (TimeoutError, aiohttp.ClientError, OSError):
        return b""

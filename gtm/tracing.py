"""Traces: one OpenTelemetry span per request at each tier, linked by W3C ``traceparent``.

A request that reaches a GPU crosses up to three gtm processes — the front door, a
regional LB (two when it spills to a peer region) and a zone agent — and then the worker.
With tracing on, each tier's application (:func:`install`, beside the access log) opens
one SERVER span per request, when it arrives, and ends it when its handler is done (the
middleware and a lean server beside the application, :mod:`gtm.http1`, both through
:class:`Spans`):

* **Parent**: the incoming ``traceparent``/``tracestate`` (W3C Trace Context, with the
  OpenTelemetry API's own propagator), so a client's trace id is kept and each tier's
  span is the child of the span of the hop before it. The relays pass this hop's span
  on (:func:`inject`, where each tier builds its upstream headers), to the next tier and,
  from the zone agent, to the worker. With tracing off the client's header crosses every
  tier unchanged, as any end-to-end header does.
* **Attributes** (:data:`ATTRIBUTES` names them): the HTTP request (method, path,
  status), the GenAI semantic conventions where they fit (``gen_ai.operation.name``,
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``/``output_tokens`` — the
  response's usage where the tier reads it, else ``gen_ai.request.max_tokens`` and the
  counted prompt), and where it went: tenant id, client country and where it came from,
  decision id, request id, region/zone/GPU that served it, the spill (from, to) and a
  refusal's reason (the OpenAI error's ``code``). What the tier learns while handling
  the request arrives through :func:`gtm.access.tell` (one call feeds the access line
  and the span); what the response says is read from its ``x-gtm-*`` headers. **Never**
  a prompt, a completion, a key or any other header.
* **The decision** (:func:`decided`, where the tier decides; only when :func:`traced`):
  reason codes, the regions residency allows, the predicted TTFT, the regional route,
  the zone's profile and the prompt's prefix blocks found cached.
* **Events**: each attempt that failed before its first byte (``attempt_failed``, with
  the target and why; :func:`attempt_failed`, called by :class:`gtm.relay.Relay`).

One switch per daemon, ``--trace-exporter none|otlp|console|file`` (``GTM_TRACE_EXPORTER``;
:func:`trace_options`): ``none`` (the default) installs nothing and imports nothing of
OpenTelemetry, so tracing off costs a request one dictionary lookup where a tier calls
in (:func:`tell`, :func:`inject`, :func:`traced`); ``otlp`` sends batches over
OTLP/HTTP (configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables; the exporter is
the ``otlp`` extra, named when it is missing); ``console`` prints each span on stdout;
``file`` appends each span as one JSON line to ``--trace-file`` (``GTM_TRACE_FILE``),
one ``write`` per span, so several processes may share the file (the format is the
SDK's ``ReadableSpan.to_json`` on one line).

The tracer is injected (:class:`Tracing`, built by :func:`open_tracing` or from a
``TracerProvider`` with :meth:`Tracing.of`); OpenTelemetry's global tracer provider
and propagators are neither read nor set.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Collection, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import click
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from gtm import headers as gtm_headers
from gtm._version import __version__
from gtm.cli_types import NewFile
from gtm.errors import ConfigError, MissingExtra
from gtm.extras import Extra, install_line
from gtm.inbound import Scope
from gtm.models import Tier
from gtm.serve import CLIENT_CLOSED, SERVICE_PATHS

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import Span, Tracer, TracerProvider

#: The W3C Trace Context headers.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_CONTEXT_HEADERS = (TRACEPARENT, TRACESTATE)
#: The instrumentation scope's name.
SCOPE = "gtm"
#: Largest error body read for its ``code`` (an OpenAI error is a few hundred bytes).
_ERROR_BODY_BYTES = 16384


class TraceExporter(StrEnum):
    """``--trace-exporter``: where a daemon's spans go."""

    NONE = "none"
    #: OTLP over HTTP/protobuf (the ``otlp`` extra), batched.
    OTLP = "otlp"
    #: Each span as JSON on stdout, as it ends.
    CONSOLE = "console"
    #: Each span as one JSON line appended to ``--trace-file``, as it ends.
    FILE = "file"


#: The span attributes, by what they say (OpenTelemetry semantic conventions where one
#: fits: HTTP, client, GenAI; ``gtm.*`` for the decision).
ATTRIBUTES: Mapping[str, str] = {
    "tier": "gtm.tier",
    "method": "http.request.method",
    "path": "url.path",
    "status": "http.response.status_code",
    "peer": "network.peer.address",
    "client": "client.address",
    "operation": "gen_ai.operation.name",
    "model": "gen_ai.request.model",
    "max_tokens": "gen_ai.request.max_tokens",
    "tokens_in": "gen_ai.usage.input_tokens",
    "tokens_out": "gen_ai.usage.output_tokens",
    "tokens_source": "gtm.tokens.source",
    "tenant": "gtm.tenant.id",
    "country": "gtm.client.country",
    "location_source": "gtm.client.location_source",
    "request_id": "gtm.request.id",
    "decision_id": "gtm.decision.id",
    "region": "gtm.region",
    "zone": "gtm.zone",
    "gpu": "gtm.gpu",
    "spill_from": "gtm.spill.from",
    "spill_to": "gtm.spill.to",
    "refusal": "gtm.refusal.reason",
    "route": "gtm.decision.route",
    "reasons": "gtm.decision.reasons",
    "allowed": "gtm.decision.allowed_regions",
    "predicted_ttft_ms": "gtm.decision.predicted_ttft_ms",
    "profile": "gtm.decision.profile",
    "matched_blocks": "gtm.decision.matched_blocks",
    "cached": "gtm.decision.cached",
    "end": "gtm.end",
}
_A = ATTRIBUTES

#: ``gen_ai.operation.name`` by the OpenAI path.
OPERATIONS: Mapping[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}

#: The response headers that say where a request was served, by attribute.
_SERVED_HEADERS = (
    ("region", gtm_headers.REGION),
    ("zone", gtm_headers.ZONE),
    ("gpu", gtm_headers.GPU),
    ("decision_id", gtm_headers.DECISION_ID),
    ("request_id", gtm_headers.REQUEST_ID),
)


@dataclass(frozen=True, slots=True)
class Tracing:
    """A process's tracer, injected into each tier it runs (``tracer`` ``None``: off).

    ``provider`` is what :meth:`shutdown` flushes (the one :func:`open_tracing` built);
    a provider given to :meth:`of` stays its owner's to shut down.
    """

    tracer: Tracer | None = None
    provider: SdkTracerProvider | None = field(default=None, repr=False)

    @classmethod
    def of(cls, provider: TracerProvider) -> Tracing:
        """Tracing with ``provider``'s gtm tracer (tests inject an in-memory one)."""
        return cls(provider.get_tracer(SCOPE, __version__))

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def shutdown(self) -> None:
        """Export what is still batched and stop the exporter (a daemon's last step)."""
        if self.provider is not None:
            self.provider.shutdown()


#: Tracing off: nothing installed, nothing imported.
OFF = Tracing()


# ---------------------------------------------------------------------------- setup


def open_tracing(
    exporter: TraceExporter | str,
    *,
    service: str,
    file: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> Tracing:
    """The daemon's :class:`Tracing` for ``--trace-exporter`` (:data:`OFF` for ``none``).

    ``service`` is the resource's ``service.name`` (``gtm-global``, ``gtm-regional``,
    ``gtm-zone``); ``attributes`` more resource attributes (its region, zone).
    Raises :class:`~gtm.errors.ConfigError` for ``file`` without a file and
    :class:`~gtm.errors.MissingExtra` for ``otlp`` without its exporter.
    """
    kind = TraceExporter(exporter)
    if kind is TraceExporter.NONE:
        return OFF
    if kind is TraceExporter.FILE and not file:
        raise ConfigError("--trace-exporter file needs --trace-file (GTM_TRACE_FILE)")
    processor = _processor(kind, file)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

    resource = Resource.create(
        {"service.name": service, "service.version": __version__, **(attributes or {})}
    )
    # No atexit hook (a global): the daemon shuts its tracing down itself.
    provider = SdkTracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return Tracing(provider.get_tracer(SCOPE, __version__), provider)


def _processor(kind: TraceExporter, file: str | None) -> SpanProcessor:
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    if kind is TraceExporter.OTLP:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ModuleNotFoundError:
            raise MissingExtra(
                "--trace-exporter otlp: the OTLP exporter is not installed (extra "
                f"'{Extra.OTLP.value}'): {install_line(Extra.OTLP)}"
            ) from None
        return BatchSpanProcessor(OTLPSpanExporter())
    if kind is TraceExporter.CONSOLE:
        return SimpleSpanProcessor(ConsoleSpanExporter())
    assert file is not None
    return SimpleSpanProcessor(json_lines_exporter(file))


def json_lines_exporter(path: str) -> SpanExporter:
    """A span exporter appending each span to ``path`` as one JSON line, in one
    ``write`` (``O_APPEND``), so processes sharing the file never interleave lines."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLinesExporter(SpanExporter):
        def __init__(self) -> None:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            if self._fd is None:
                return SpanExportResult.FAILURE
            for span in spans:
                os.write(self._fd, (span.to_json(indent=None) + "\n").encode())
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    return JsonLinesExporter()


F = TypeVar("F", bound=Callable[..., Any])


def trace_options() -> Callable[[F], F]:
    """``--trace-exporter`` and ``--trace-file`` for a daemon's command (their values
    ``trace_exporter`` and ``trace_file`` go to :func:`open_tracing`)."""

    def decorate(command: F) -> F:
        command = click.option(
            "--trace-file",
            type=NewFile(),
            default=None,
            help="With --trace-exporter file: the file each span is appended to, one JSON "
            "line each (processes may share it).",
        )(command)
        return click.option(
            "--trace-exporter",
            type=click.Choice([e.value for e in TraceExporter]),
            default=TraceExporter.NONE.value,
            show_default=True,
            help="OpenTelemetry spans, one per request (W3C traceparent honoured and passed "
            "on): none, otlp (OTEL_EXPORTER_OTLP_* settings; the 'otlp' extra), console "
            "(stdout) or file (--trace-file).",
        )(command)

    return decorate


# ---------------------------------------------------------------------------- per request


class _Hop:
    """One request's span at this tier, and how to pass it on."""

    __slots__ = ("body", "inject", "response", "span", "status")

    def __init__(self, span: Span, inject: Callable[[dict[str, str], Context], None]) -> None:
        self.span = span
        self.inject = inject
        #: The response's headers once its head was sent (a stream the client may leave
        #: mid-way), else None.
        self.response: Mapping[str, str] | None = None
        #: Its status (with :attr:`response`).
        self.status = 0
        #: A whole response's body (an error's reason is read from it), else None.
        self.body: bytes | None = None

    def headers(self) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) naming this span as the parent."""
        from opentelemetry.trace import set_span_in_context

        carrier: dict[str, str] = {}
        self.inject(carrier, set_span_in_context(self.span))
        return carrier


#: Where a request's span is kept in its per-request state (:class:`gtm.inbound.Scope`).
SPAN_KEY = web.RequestKey("gtm_trace_hop", _Hop)
_HOP = SPAN_KEY


class Spans:
    """One tier's SERVER span per request, whichever server parsed it: aiohttp's
    middleware (:func:`install`) and the lean server (:mod:`gtm.http1`) both
    :meth:`start` and :meth:`finish` through here, so the span is the same."""

    def __init__(
        self,
        tracer: Tracer,
        tier: Tier,
        *,
        region: str | None = None,
        zone: str | None = None,
        skip: Collection[str] = SERVICE_PATHS,
    ) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)
        here = {_A["tier"]: tier.value}
        if region is not None:
            here[_A["region"]] = region
        if zone is not None:
            here[_A["zone"]] = zone
        self._here = here
        #: Paths without a span (probes, scrapes).
        self.skip = skip

    def start(self, request: Scope) -> _Hop:
        """Open ``request``'s span (its parent: the incoming ``traceparent``); the
        caller keeps the hop under :data:`SPAN_KEY` in the request's state."""
        parent = self._propagator.extract(request.headers)
        span = self._tracer.start_span(
            f"{request.method} {request.path}",
            context=parent,
            kind=self._kind,
            attributes=_request_attributes(request, self._here),
        )
        return _Hop(span, self._propagator.inject)

    def finish(self, hop: _Hop, status: int, end: str) -> None:
        """End the span: the status the client got, how the handling ended (``ok``,
        ``disconnect``, ``error``) and what the response's headers said."""
        span = hop.span
        span.set_attributes(_response_attributes(hop.response, hop.body, status, end))
        if status >= 500:
            span.set_status(self._error)
        span.end()


def spans(
    tier: Tier,
    tracing: Tracing,
    *,
    region: str | None = None,
    zone: str | None = None,
    skip: Collection[str] = SERVICE_PATHS,
) -> Spans | None:
    """The tier's :class:`Spans`, or None when ``tracing`` is off."""
    if tracing.tracer is None:
        return None
    return Spans(tracing.tracer, tier, region=region, zone=zone, skip=skip)


def install(
    app: web.Application,
    tier: Tier,
    tracing: Tracing,
    *,
    region: str | None = None,
    zone: str | None = None,
    skip: Collection[str] = SERVICE_PATHS,
) -> Spans | None:
    """One SERVER span per request of ``app`` (see the module docstring): the outermost
    middleware and a response-prepare hook (a client that leaves mid-stream got that
    response's status and ``x-gtm-*`` headers); nothing when ``tracing`` is off.
    ``region``/``zone``: where this process is, for spans whose response does not say.
    Returns the :class:`Spans` it installed (a lean server beside ``app`` uses them)."""
    made = spans(tier, tracing, region=region, zone=zone, skip=skip)
    if made is None:
        return None

    @web.middleware
    async def trace(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in made.skip:
            return await handler(request)
        hop = request[_HOP] = made.start(request)
        status, end = 500, "error"
        try:
            response = await handler(request)
            status, end = response.status, "ok"
            _sent(hop, response)
            return response
        except web.HTTPException as exc:  # answered by aiohttp itself
            status, end = exc.status, "ok"
            raise
        except asyncio.CancelledError:  # the client left: mid-stream, the status it got
            end = "disconnect"
            status = CLIENT_CLOSED if hop.response is None else hop.status
            raise
        finally:
            made.finish(hop, status, end)

    async def prepared(request: web.Request, response: web.StreamResponse) -> None:
        hop = request.get(_HOP)
        if hop is not None:
            _sent(hop, response)

    app.middlewares.insert(0, trace)
    app.on_response_prepare.append(prepared)
    return made


def _sent(hop: _Hop, response: web.StreamResponse) -> None:
    hop.response = response.headers
    hop.status = response.status
    body = response.body if isinstance(response, web.Response) else None
    hop.body = body if isinstance(body, bytes) else None


def _request_attributes(request: Scope, here: Mapping[str, str]) -> dict[str, str]:
    attributes = {**here, _A["method"]: request.method, _A["path"]: request.path}
    operation = OPERATIONS.get(request.path)
    if operation is not None:
        attributes[_A["operation"]] = operation
    if request.remote:
        attributes[_A["peer"]] = request.remote
    return attributes


def _response_attributes(
    got: Mapping[str, str] | None, body: bytes | None, status: int, end: str
) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {_A["status"]: status, _A["end"]: end}
    if got is None:
        return attributes
    for name, header in _SERVED_HEADERS:
        value = got.get(header)
        if value:
            attributes[_A[name]] = value
    spilled = got.get(gtm_headers.SPILLED_FROM)
    if spilled:
        attributes[_A["spill_from"]] = spilled
        served = got.get(gtm_headers.REGION)
        if served:
            attributes[_A["spill_to"]] = served
    if status >= 400 and body is not None:
        code = error_code_of(body)
        if code:
            attributes[_A["refusal"]] = code
    return attributes


def error_code(response: web.StreamResponse) -> str | None:
    """The ``code`` (else ``type``) of an OpenAI-shaped JSON error response, if it is one
    and whole (a refusal's reason: ``residency:denied``, ``quota_exceeded``, …)."""
    if not isinstance(response, web.Response):
        return None
    body = response.body
    return error_code_of(body) if isinstance(body, bytes) else None


def error_code_of(body: bytes) -> str | None:
    """:func:`error_code` of a whole response's body."""
    if not body.startswith(b"{") or len(body) > _ERROR_BODY_BYTES:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict):
        return None
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def tell(
    request: Scope,
    *,
    tenant: str | None = None,
    model: str | None = None,
    country: str | None = None,
    location_source: str | None = None,
    client: object | None = None,
    decision_id: str | None = None,
    spill_from: str | None = None,
    tokens_in: int | None = None,
    tokens_out: int | None = None,
    tokens_source: str | None = None,
) -> None:
    """Set what the tier knows of ``request`` on its span (what :func:`gtm.access.tell`
    is told; ``None`` keeps what was set). Tokens: the response's usage
    (``tokens_source`` ``usage``) are ``gen_ai.usage.*``; the tier's estimates are the
    counted prompt (``gen_ai.usage.input_tokens``) and ``gen_ai.request.max_tokens``.
    Does nothing when tracing is off."""
    hop = request.get(_HOP)
    if hop is None:
        return
    told: dict[str, str | int] = {}
    for name, value in (
        ("tenant", tenant),
        ("model", model),
        ("country", country),
        ("location_source", location_source),
        ("decision_id", decision_id),
        ("spill_from", spill_from),
        ("tokens_in", tokens_in),
        ("tokens_source", tokens_source),
    ):
        if value is not None:
            told[_A[name]] = value
    if client is not None:
        told[_A["client"]] = str(client)
    if tokens_out is not None:
        told[_A["tokens_out" if tokens_source == "usage" else "max_tokens"]] = tokens_out
    hop.span.set_attributes(told)


def traced(request: Scope) -> bool:
    """Whether ``request`` has a span: a tier asks before it gathers what only the span
    wants (:func:`decided`), so tracing off costs one lookup."""
    return request.get(_HOP) is not None


def decided(
    request: Scope,
    *,
    route: str | None = None,
    reasons: Sequence[str] = (),
    allowed: Sequence[str] = (),
    predicted_ttft_ms: float | None = None,
    profile: str | None = None,
    matched_blocks: int | None = None,
    cached: bool | None = None,
) -> None:
    """The tier's decision on ``request``'s span (the last one made, after a retry): the
    regional ``route`` (local, queue, spill), reason codes, the regions residency allows,
    the predicted TTFT, the zone's profile and prefix blocks found cached, whether the
    front door's decision cache answered. Nothing when tracing is off."""
    hop = request.get(_HOP)
    if hop is None:
        return
    told: dict[str, str | int | float | bool | Sequence[str]] = {}
    if route is not None:
        told[_A["route"]] = route
    if reasons:
        told[_A["reasons"]] = tuple(reasons)
    if allowed:
        told[_A["allowed"]] = tuple(allowed)
    if predicted_ttft_ms is not None:
        told[_A["predicted_ttft_ms"]] = round(predicted_ttft_ms, 3)
    if profile is not None:
        told[_A["profile"]] = profile
    if matched_blocks is not None:
        told[_A["matched_blocks"]] = matched_blocks
    if cached is not None:
        told[_A["cached"]] = cached
    hop.span.set_attributes(told)


def attempt_failed(request: Scope, target: str, kind: str, status: int | None, detail: str) -> None:
    """An ``attempt_failed`` event on ``request``'s span: an attempt on ``target`` failed
    before its first byte (``kind``: connect, timeout, reset, status)."""
    hop = request.get(_HOP)
    if hop is None:
        return
    attributes: dict[str, str | int] = {"gtm.target": target, "gtm.failure": kind}
    if status is not None:
        attributes[_A["status"]] = status
    attributes["gtm.failure.detail"] = detail[:200]
    hop.span.add_event("attempt_failed", attributes)


def inject(request: Scope, headers: CIMultiDict[str] | MutableSequence[tuple[str, str]]) -> None:
    """Put this hop's span in the ``headers`` going upstream (``traceparent``, and
    ``tracestate`` when there is one), instead of the ones that came in; nothing when
    the request has no span (tracing off: the client's pass on unchanged)."""
    hop = request.get(_HOP)
    if hop is None:
        return
    carrier = hop.headers()
    if isinstance(headers, CIMultiDict):
        for name in _CONTEXT_HEADERS:
            headers.popall(name, None)
        headers.update(carrier)
        return
    headers[:] = [(k, v) for k, v in headers if k.lower() not in _CONTEXT_HEADERS]
    headers.extend(carrier.items())


__all__ = [
    "ATTRIBUTES",
    "OFF",
    "OPERATIONS",
    "SPAN_KEY",
    "TRACEPARENT",
    "TRACESTATE",
    "Spans",
    "TraceExporter",
    "Tracing",
    "attempt_failed",
    "decided",
    "error_code",
    "error_code_of",
    "inject",
    "install",
    "json_lines_exporter",
    "open_tracing",
    "spans",
    "tell",
    "trace_options",
    "traced",
]

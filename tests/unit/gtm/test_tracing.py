"""gtm.tracing: one span per request, parented by the incoming W3C ``traceparent`` and
passed on as the next hop's parent, with the decision's attributes and never a prompt or
a key; the exporters a daemon picks; tracing off installs nothing."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import click
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from click.testing import CliRunner
from multidict import CIMultiDict
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gtm import access, tracing
from gtm import headers as gtm_headers
from gtm.envvars import from_environment
from gtm.errors import ConfigError, MissingExtra
from gtm.models import Tier
from gtm.openai_errors import openai_error
from gtm.tracing import OFF, TraceExporter, Tracing, open_tracing, trace_options

SECRET_KEY = "sk-unit-secret-key"
PROMPT = "unit-test-prompt-text"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
TRACESTATE = "vendor=abc"
#: What each request's handler passed on upstream (the headers after inject).
SENT = web.AppKey("sent", list[dict[str, str]])


def _app(tracer: Tracing) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        access.tell(
            request,
            tenant="acme",
            model=body["model"],
            country="DE",
            location_source="geoip",
            client="192.0.2.7",
            decision_id="d-1",
            tokens_in=12,
            tokens_out=64,
            tokens_source=access.TokenSource.ESTIMATE,
        )
        upstream = CIMultiDict(request.headers)  # what a relay copies end to end
        tracing.inject(request, upstream)
        request.app[SENT].append(dict(upstream))
        tracing.attempt_failed(request, "eu-central", "status", 503, "HTTP 503")
        assert tracing.traced(request)
        tracing.decided(
            request,
            route="spill",
            reasons=("residency:allowed", "spread"),
            allowed=("eu-central", "eu-west"),
            predicted_ttft_ms=41.23456,
            profile="default",
            matched_blocks=3,
            cached=False,
        )
        access.tell(request, tokens_in=11, tokens_out=5, tokens_source=access.TokenSource.USAGE)
        headers = {
            gtm_headers.REGION: "eu-west",
            gtm_headers.ZONE: "eu-west-a",
            gtm_headers.GPU: "gpu-7",
            gtm_headers.SPILLED_FROM: "eu-central",
            gtm_headers.REQUEST_ID: "r-1",
        }
        return web.json_response({"choices": []}, headers=headers)

    async def refused(request: web.Request) -> web.Response:
        return openai_error(451, "no region", "residency_refused", "residency:denied")

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("boom")

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={gtm_headers.GPU: "gpu-3"})
        await response.prepare(request)
        await response.write(b"data: first\n")
        await asyncio.Event().wait()  # until the client leaves (the handler is cancelled)
        return response

    app = web.Application()
    app[SENT] = []
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", refused)
    app.router.add_post("/v1/embeddings", broken)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/v1/stream", stream)
    tracing.install(app, Tier.REGIONAL, tracer, region="eu-central")
    return app


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


class Ended(SpanProcessor):
    """Sets an event when a span ends (a test waits for it instead of sleeping)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def on_end(self, span: ReadableSpan) -> None:
        self.event.set()


@pytest.fixture
def ended() -> Ended:
    return Ended()


@pytest.fixture
def provider(exporter: InMemorySpanExporter, ended: Ended) -> Iterator[TracerProvider]:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(ended)
    yield provider
    provider.shutdown()


@pytest.fixture
async def client(
    provider: TracerProvider,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    server = TestServer(_app(Tracing.of(provider)), handler_cancellation=True)
    async with TestClient(server) as test_client:
        yield test_client


async def _chat(
    client: TestClient[web.Request, web.Application], headers: dict[str, str]
) -> list[dict[str, str]]:
    """One chat request; the headers its handler passed on upstream so far."""
    body = {"model": "m-1", "messages": [{"role": "user", "content": PROMPT}]}
    sent = {"Authorization": f"Bearer {SECRET_KEY}", **headers}
    async with client.post("/v1/chat/completions", json=body, headers=sent) as response:
        assert response.status == 200
    app = client.app
    assert app is not None
    return app[SENT]


def _only(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


async def test_a_client_traceparent_is_the_spans_parent_and_the_next_hop_gets_this_span(
    client: TestClient[web.Request, web.Application], exporter: InMemorySpanExporter
) -> None:
    passed_on = await _chat(client, {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
    span = _only(exporter)
    assert span.kind is SpanKind.SERVER
    assert f"{span.context.trace_id:032x}" == CLIENT_TRACE  # the client's trace id is kept
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == CLIENT_SPAN
    assert span.parent.is_remote
    (sent,) = passed_on
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
    assert span_id == f"{span.context.span_id:016x}" != CLIENT_SPAN  # this hop, not the client
    assert sent["tracestate"] == TRACESTATE
    assert [k for k in sent if k.lower() == "traceparent"] == ["traceparent"]  # replaced


async def test_without_a_traceparent_the_span_starts_a_trace(
    client: TestClient[web.Request, web.Application], exporter: InMemorySpanExporter
) -> None:
    passed_on = await _chat(client, {})
    span = _only(exporter)
    assert span.parent is None
    assert passed_on[0]["traceparent"].split("-")[1] == f"{span.context.trace_id:032x}"


async def test_the_span_names_the_decision_and_genai_facts_never_the_prompt_or_key(
    client: TestClient[web.Request, web.Application], exporter: InMemorySpanExporter
) -> None:
    await _chat(client, {"traceparent": TRACEPARENT})
    span = _only(exporter)
    assert span.name == "POST /v1/chat/completions"
    attributes = dict(span.attributes or {})
    assert attributes == {
        "gtm.tier": "regional",
        "gtm.region": "eu-west",  # where it was served (the response says), not "here"
        "gtm.zone": "eu-west-a",
        "gtm.gpu": "gpu-7",
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "network.peer.address": "127.0.0.1",
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m-1",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 5,
        "gtm.tokens.source": "usage",
        "gtm.tenant.id": "acme",
        "gtm.client.country": "DE",
        "gtm.client.location_source": "geoip",
        "client.address": "192.0.2.7",
        "gtm.decision.id": "d-1",
        "gtm.request.id": "r-1",
        "gtm.spill.from": "eu-central",
        "gtm.spill.to": "eu-west",
        "gtm.decision.route": "spill",
        "gtm.decision.reasons": ("residency:allowed", "spread"),
        "gtm.decision.allowed_regions": ("eu-central", "eu-west"),
        "gtm.decision.predicted_ttft_ms": 41.235,
        "gtm.decision.profile": "default",
        "gtm.decision.matched_blocks": 3,
        "gtm.decision.cached": False,
        "http.response.status_code": 200,
        "gtm.end": "ok",
    }
    (event,) = span.events
    assert event.name == "attempt_failed"
    assert dict(event.attributes or {}) == {
        "gtm.target": "eu-central",
        "gtm.failure": "status",
        "http.response.status_code": 503,
        "gtm.failure.detail": "HTTP 503",
    }
    text = json.dumps(json.loads(span.to_json()))
    assert PROMPT not in text
    assert SECRET_KEY not in text


async def test_a_refusal_names_its_reason_and_a_failure_is_an_error(
    client: TestClient[web.Request, web.Application], exporter: InMemorySpanExporter
) -> None:
    async with client.post("/v1/completions", json={}) as response:
        assert response.status == 451
    async with client.post("/v1/embeddings", json={}) as response:
        assert response.status == 500
    refused, broken = exporter.get_finished_spans()
    assert refused.attributes is not None
    assert broken.attributes is not None
    assert refused.attributes["gtm.refusal.reason"] == "residency:denied"
    assert refused.attributes["gtm.region"] == "eu-central"  # no answer: where it was
    assert refused.status.status_code is StatusCode.UNSET
    assert (broken.attributes["http.response.status_code"], broken.attributes["gtm.end"]) == (
        500,
        "error",
    )
    assert broken.status.status_code is StatusCode.ERROR


async def test_a_client_that_leaves_mid_stream_ends_the_span_with_what_it_got(
    client: TestClient[web.Request, web.Application],
    exporter: InMemorySpanExporter,
    ended: Ended,
) -> None:
    response = await client.post("/v1/stream")
    assert await response.content.readline() == b"data: first\n"
    response.close()  # the client goes away; the handler is cancelled
    await asyncio.wait_for(ended.event.wait(), 5.0)
    attributes = dict(_only(exporter).attributes or {})
    assert (attributes["http.response.status_code"], attributes["gtm.end"]) == (200, "disconnect")
    assert attributes["gtm.gpu"] == "gpu-3"


async def test_probes_are_not_traced(
    client: TestClient[web.Request, web.Application], exporter: InMemorySpanExporter
) -> None:
    async with client.get("/healthz") as response:
        assert response.status == 200
    assert exporter.get_finished_spans() == ()


def test_tracing_off_installs_nothing_and_passes_the_clients_header_on() -> None:
    app = web.Application()
    tracing.install(app, Tier.ZONE, OFF)
    assert list(app.middlewares) == []
    request = make_mocked_request("POST", "/v1/completions", app=app)
    assert not tracing.traced(request)
    tracing.decided(request, route="local")  # nothing to set: no error
    headers = CIMultiDict({"traceparent": TRACEPARENT})
    tracing.inject(request, headers)
    assert headers["traceparent"] == TRACEPARENT
    assert open_tracing("none", service="gtm-zone") is OFF
    assert not OFF.enabled


async def test_inject_replaces_the_context_headers_of_a_header_list(
    provider: TracerProvider,
) -> None:
    app = web.Application()
    tracing.install(app, Tier.ZONE, Tracing.of(provider))
    (middleware,) = app.middlewares
    request = make_mocked_request("POST", "/v1/completions", headers={"traceparent": TRACEPARENT})
    headers = [("traceparent", TRACEPARENT), ("TraceState", "x=1"), ("x-request-id", "r")]
    tracing.inject(request, headers)  # no span yet: untouched
    assert headers[0] == ("traceparent", TRACEPARENT)

    async def handler(request: web.Request) -> web.StreamResponse:
        tracing.inject(request, headers)
        return web.Response()

    await middleware(request, handler)
    names = [k.lower() for k, _ in headers]
    assert names.count("traceparent") == 1
    assert "tracestate" not in names
    assert dict(headers)["x-request-id"] == "r"
    assert dict(headers)["traceparent"].split("-")[1] == CLIENT_TRACE
    assert dict(headers)["traceparent"] != TRACEPARENT


def test_the_file_exporter_appends_one_json_line_per_span(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    first = open_tracing(TraceExporter.FILE, service="gtm-zone", file=str(path))
    second = open_tracing(
        "file", service="gtm-regional", file=str(path), attributes={"gtm.region": "eu-west"}
    )
    assert first.tracer is not None
    assert second.tracer is not None
    with first.tracer.start_as_current_span("one"):
        pass
    second.tracer.start_span("two").end()
    first.shutdown()
    second.shutdown()
    lines = path.read_text().splitlines()
    spans = [json.loads(line) for line in lines]
    assert [s["name"] for s in spans] == ["one", "two"]
    services = [s["resource"]["attributes"]["service.name"] for s in spans]
    assert services == ["gtm-zone", "gtm-regional"]
    assert spans[1]["resource"]["attributes"]["gtm.region"] == "eu-west"


def test_the_file_exporter_needs_a_file() -> None:
    with pytest.raises(ConfigError, match="--trace-file"):
        open_tracing("file", service="gtm-zone")


def test_otlp_without_its_exporter_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(MissingExtra, match=r"gtm-traffic-manager\[otlp\]"):
        open_tracing("otlp", service="gtm-global")


def test_otlp_with_its_exporter_batches_spans() -> None:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    traced = open_tracing("otlp", service="gtm-global")
    assert traced.provider is not None
    processors = traced.provider._active_span_processor._span_processors
    assert [type(p) for p in processors] == [BatchSpanProcessor]
    traced.shutdown()  # nothing ended: nothing sent


def test_the_daemon_options_come_from_the_environment_too(tmp_path: Path) -> None:
    @from_environment
    @click.command()
    @trace_options()
    def daemon(trace_exporter: str, trace_file: str | None) -> None:
        click.echo(f"{trace_exporter} {trace_file}")

    runner = CliRunner()
    file = str(tmp_path / "t.jsonl")
    env = {"GTM_TRACE_EXPORTER": "file", "GTM_TRACE_FILE": file}
    assert runner.invoke(daemon, [], env=env).output == f"file {file}\n"
    assert runner.invoke(daemon, []).output == "none None\n"
    bad = runner.invoke(daemon, ["--trace-exporter", "jaeger"])
    assert bad.exit_code == 2
    assert "jaeger" in bad.output
    assert "GTM_TRACE_EXPORTER" in runner.invoke(daemon, ["--help"]).output

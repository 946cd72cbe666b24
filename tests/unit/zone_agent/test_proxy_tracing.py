"""The zone agent passes its span on to the worker: the ``traceparent`` a GPU worker gets
names the zone's span, in the client's trace (gtm.tracing); with tracing off the
client's header reaches the worker unchanged."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gtm import tracing
from gtm.models import Tier
from gtm.tracing import Tracing

from .helpers import RecordingPool, chat_relay, relay_target

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
TARGET = relay_target("g")


async def test_the_worker_gets_the_zone_span_as_its_parent() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = web.Application()
    tracing.install(app, Tier.ZONE, Tracing.of(provider), region="r", zone="z")
    (middleware,) = app.middlewares
    request = make_mocked_request(
        "POST", "/v1/chat/completions", headers={"traceparent": TRACEPARENT}, app=app
    )
    pool = RecordingPool()

    async def handler(request: web.Request) -> web.StreamResponse:
        await chat_relay(request, pool).open(TARGET)
        return web.Response()

    await middleware(request, handler)
    (span,) = exporter.get_finished_spans()
    (sent,) = pool.sent
    parents = [v for k, v in sent if k.lower() == "traceparent"]
    assert parents == [f"00-{CLIENT_TRACE}-{span.context.span_id:016x}-01"]
    assert ("x-request-id", "r-1") in sent
    provider.shutdown()


async def test_with_tracing_off_the_clients_traceparent_reaches_the_worker() -> None:
    request = make_mocked_request(
        "POST", "/v1/chat/completions", headers={"traceparent": TRACEPARENT}
    )
    pool = RecordingPool()
    await chat_relay(request, pool).open(TARGET)
    (sent,) = pool.sent
    assert [v for k, v in sent if k.lower() == "traceparent"] == [TRACEPARENT]

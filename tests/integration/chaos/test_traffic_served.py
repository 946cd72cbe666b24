"""The load records where each request was served — region, zone and GPU — from the
answer's ``x-gtm-*`` headers, through a real HTTP server on loopback (the zone and GPU
come through aiohttp's request trace, per attempt)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from chaos.journal import Journal
from chaos.traffic import LoadSpec, Planned, Stream, Traffic
from fleetsim.traces import TraceRequest
from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor


async def _completions(request: web.Request) -> web.StreamResponse:
    zone = "eu-central-b" if request.headers.get("Authorization", "").endswith("b") else "eu-a"
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "x-gtm-region": "eu-central",
            "x-gtm-zone": zone,
            "x-gtm-gpu": f"{zone}-gpu-1",
        }
    )
    await response.prepare(request)
    chunk = {"choices": [{"delta": {"content": "hi"}}]}
    await response.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
    await response.write_eof()
    return response


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.timeout(30)
async def test_each_request_records_the_zone_and_gpu_that_served_it(url: str) -> None:
    streams = (Stream(label="a", api_key="key-a"), Stream(label="b", api_key="key-b"))
    spec = LoadSpec(duration_s=1.0, streams=streams, max_output_tokens=4)
    planned = [Planned(0.0, TraceRequest(0.0, 16, 4), streams[i % 2]) for i in range(6)]
    journal = Journal(t0_wall=0.0)
    clock = SystemClock()
    async with TaskSupervisor(registry=new_registry(), clock=clock) as supervisor:
        traffic = Traffic(
            spec, planned, url, journal, clock=clock, t0=clock.monotonic(), supervisor=supervisor
        )
        await traffic.run()
    served = sorted((r.stream, r.region, r.zone, r.gpu, r.ok) for r in journal.requests)
    a = ("a", "eu-central", "eu-a", "eu-a-gpu-1", True)
    b = ("b", "eu-central", "eu-central-b", "eu-central-b-gpu-1", True)
    assert served == [a, a, a, b, b, b]

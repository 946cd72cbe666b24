"""The zone agent reads a worker's /metrics with the fast reader, steps aside to
prometheus_client's parser on a line of unusual shape (counted per GPU, logged when it
starts, the same figures), and turns garbage into a scrape failure, never a crash."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from gtm.gpu_profiles import LLAMA_8B
from zone_agent.scrape import Parser

from .conftest import Zone, ZoneFactory

#: ``await worker(body)`` → the URL of a worker serving ``body`` on /metrics.
Worker = Callable[[str], Awaitable[str]]

USUAL = f'vllm:num_requests_running{{model_name="{LLAMA_8B}"}} 3\n'
#: Legal text format (tokens may be separated by tabs), not the reader's shape.
UNUSUAL = f'vllm:num_requests_running{{model_name="{LLAMA_8B}"}}\t3\n'
GARBAGE = f'vllm:num_requests_running{{model_name="{LLAMA_8B}" 3\n'


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    """``worker(body)`` → the URL of a worker serving ``body`` on /metrics ("ok" else)."""
    runners: list[web.AppRunner] = []

    async def start(body: str) -> str:
        async def serve(request: web.Request) -> web.Response:
            return web.Response(text=body if request.path == "/metrics" else "ok")

        app = web.Application()
        app.router.add_get("/{tail:.*}", serve)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def _reference_parses(zone: Zone) -> float:
    value = zone.agent.registry.get_sample_value(
        "gtm_zone_scrape_reference_parses_total", {"gpu": "w"}
    )
    return value or 0.0


@pytest.mark.parametrize(("body", "parser"), [(USUAL, Parser.READER), (UNUSUAL, Parser.REFERENCE)])
async def test_a_worker_s_figures_are_read_whichever_parser_reads_them(
    make_zone: ZoneFactory,
    worker: Worker,
    body: str,
    parser: Parser,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = await worker(body)
    zone = await make_zone([], extra_workers=[f"{url},gpu=H100,id=w,model={LLAMA_8B}"])
    with caplog.at_level(logging.WARNING, logger="zone_agent.app"):
        await zone.agent.scrape_round()
        await zone.agent.scrape_round()
    state = zone.agent.view.gpu("w")
    assert state is not None
    assert state.metrics is not None
    assert state.metrics.parsed_by is parser
    assert state.metrics.models[LLAMA_8B].running == 3
    counted = _reference_parses(zone)
    warned = [r for r in caplog.records if "reference parser" in r.getMessage()]
    if parser is Parser.READER:
        assert counted == 0
        assert not warned
    else:
        assert counted >= 2  # every such scrape counts; the log says when it starts
        assert len(warned) <= 1
        assert all("usual shape" in r.getMessage() for r in warned)


async def test_garbage_metrics_are_a_scrape_failure(make_zone: ZoneFactory, worker: Worker) -> None:
    url = await worker(GARBAGE)
    zone = await make_zone([], extra_workers=[f"{url},gpu=H100,id=w,model={LLAMA_8B}"])
    await zone.agent.scrape_round()
    failures = zone.agent.registry.get_sample_value("gtm_zone_scrape_failures_total", {"gpu": "w"})
    assert failures is not None
    assert failures >= 1
    state = zone.agent.view.gpu("w")
    assert state is not None
    assert state.metrics is None

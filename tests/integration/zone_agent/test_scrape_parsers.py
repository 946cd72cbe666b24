"""The zone agent reads a worker's /metrics with the fast reader, steps aside to
prometheus_client's parser on a line of unusual shape (counted per GPU, logged when it
starts, the same figures), and turns garbage into a scrape failure, never a crash; each
emulator flavour, served live, is read as the reference reads it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from gpusim.metrics import MetricsFlavor
from gpusim.server import GpuSimServer
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from zone_agent import scrape as scrape_module
from zone_agent.exposition import StepAside
from zone_agent.scrape import Parser, parse_metrics, reference_samples

from .conftest import Zone, ZoneFactory, sim_config

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


@pytest.mark.parametrize("flavor", list(MetricsFlavor), ids=[f.value for f in MetricsFlavor])
async def test_a_live_emulator_s_metrics_are_read_as_the_reference_reads_them(
    flavor: MetricsFlavor,
) -> None:
    """Each flavour as a running ``GpuSimServer`` serves it over HTTP, after requests."""
    sim = GpuSimServer(sim_config("H100", metrics_flavor=flavor), registry=new_registry())
    await sim.start()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                body = {"model": LLAMA_8B, "prompt": "hello " * 50, "max_tokens": 4}
                async with http.post(sim.url + "/v1/completions", json=body) as response:
                    assert response.status == 200
                    await response.read()
            async with http.get(sim.url + "/metrics") as response:
                text = await response.text()
    finally:
        await sim.stop()
    read = scrape_module._READER.read(text)
    assert not isinstance(read, StepAside), read
    assert [(n, dict(labels), repr(v)) for n, labels, v in read] == [
        (n, dict(labels) if scrape_module._WANTED[n] else {}, repr(v))
        for n, labels, v in reference_samples(text)
    ]
    fast = parse_metrics(text, scraped_at=0.0, default_model=LLAMA_8B)
    slow = parse_metrics(text, scraped_at=0.0, default_model=LLAMA_8B, parser=Parser.REFERENCE)
    assert fast.parsed_by is Parser.READER
    assert (fast.flavor, fast.models) == (slow.flavor, slow.models)
    assert fast.flavor.value == flavor.value

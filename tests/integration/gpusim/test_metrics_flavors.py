"""Contract: a real ``gtm gpu-sim --metrics-flavor F`` process, scraped by the zone
agent's real scraper, gives the emulator's true running, waiting and KV figures.

The truth is the emulator's own ``gtm_gpusim_engine_state`` family on the same
``/metrics``. The emulator runs a hundred times slower than a GPU, so a forward pass
lasts seconds and the engine's state holds still across the reads compared.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpusim.metrics import MetricsFlavor
from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.testing.processes import GtmProcess, running
from zone_agent.engines import Flavor
from zone_agent.scrape import GpuMetrics, scrape
from zone_agent.upstream import UpstreamPool

pytestmark = pytest.mark.integration

#: Bounds, not sleeps: how long the requests may take to be admitted, and how many
#: reads are tried for three that straddle no pass boundary.
ADMITTED_TIMEOUT = 20.0
ATTEMPTS = 20
#: Engines whose names carry the KV geometry (TGI and llama.cpp leave it to the profile).
GEOMETRY = {Flavor.VLLM, Flavor.SGLANG, Flavor.TRTLLM, Flavor.DYNAMO}


def _worker(flavor: MetricsFlavor) -> AbstractAsyncContextManager[GtmProcess]:
    return running(
        ["gpu-sim", "--port", "0", "--gpu-type", "H100", "--model", LLAMA_8B,
         "--metrics-flavor", flavor.value, "--speedup", "0.01", "--max-num-seqs", "2",
         "--warmup-passes", "0"],
        stop_signal=signal.SIGKILL,
    )  # fmt: skip


async def _truth(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    truth: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "gtm_gpusim_engine_state":
            for sample in family.samples:
                truth[sample.labels["figure"]] = sample.value
    return truth


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.mark.parametrize("flavor", list(MetricsFlavor), ids=[f.value for f in MetricsFlavor])
async def test_the_scraper_reads_a_real_worker_s_true_load(
    flavor: MetricsFlavor, http: aiohttp.ClientSession
) -> None:
    async with _worker(flavor) as worker, asyncio.TaskGroup() as group:
        requests = [group.create_task(_post(http, worker.url)) for _ in range(5)]
        try:
            await _compare(flavor, http, worker.url)
        finally:
            for task in requests:
                task.cancel()


async def _post(http: aiohttp.ClientSession, url: str) -> None:
    body = {"model": LLAMA_8B, "prompt": "word " * 700, "max_tokens": 400}
    async with http.post(url + "/v1/completions", json=body) as response:
        await response.read()


async def _compare(flavor: MetricsFlavor, http: aiohttp.ClientSession, url: str) -> None:
    async with asyncio.timeout(ADMITTED_TIMEOUT):
        while True:  # bounded by the timeout: until a request is running, others wait
            truth = await _truth(http, url)
            if truth.get("running", 0) >= 1 and truth.get("waiting", 0) >= 1:
                break
            await asyncio.sleep(0.05)
    scraped: GpuMetrics | None = None
    for _ in range(ATTEMPTS):
        before = await _truth(http, url)
        pool = UpstreamPool()
        try:
            scraped = await scrape(
                pool, url, clock=SystemClock(), timeout_s=5.0, default_model=LLAMA_8B
            )
        finally:
            await pool.close()
        after = await _truth(http, url)
        if before == after:
            break
    assert before == after, "the engine never held still"
    assert scraped is not None
    assert scraped.flavor is Flavor(flavor.value)
    model = scraped.models[LLAMA_8B]
    assert model.running == after["running"] >= 1
    assert model.waiting == after["waiting"] >= 1
    assert model.kv_usage == pytest.approx(after["kv_usage"], rel=1e-12)
    assert after["kv_usage"] > 0
    if scraped.flavor in GEOMETRY:
        assert model.block_size == after["block_size"]
        assert model.kv_blocks_total == after["kv_blocks_total"]

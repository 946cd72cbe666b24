"""An operator fronts TGI, TensorRT-LLM (Triton), llama.cpp or Dynamo workers with
``gtm zone``: the zone sees the load other clients put on them and routes around it.

Real processes on loopback: two ``gtm gpu-sim`` workers exposing one engine's metric
names (``--metrics-flavor``), and ``gtm zone`` in front of them. Another client — not
through the zone — fills worker ``gpu-a``'s batch and queue directly. Once the zone has
scraped that queue, every chat sent through the zone must go to ``gpu-b`` (the
``x-gtm-gpu`` header says where). Before the zone read these engines' names, both
workers looked idle to it, and the tie went to ``gpu-a``, behind the queue.
"""

from __future__ import annotations

import asyncio
import signal
from contextlib import AbstractAsyncContextManager, AsyncExitStack

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gtm.testing.processes import GtmProcess, running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: A bound on how long the queue and the zone's scrapes of it take to appear.
EVENTUALLY_S = 20.0
#: Requests the other client keeps on gpu-a (one runs, the rest queue).
BACKGROUND = 6
CHATS = 6
#: A chat on the idle worker answers in well under this; behind the queue, never.
CHAT_TIMEOUT = aiohttp.ClientTimeout(total=10.0)


def _worker(flavor: str) -> AbstractAsyncContextManager[GtmProcess]:
    return running(
        ["gpu-sim", "--port", "0", "--gpu-type", "H100", "--model", MODEL,
         "--metrics-flavor", flavor, "--speedup", "0.05", "--max-num-seqs", "1",
         "--warmup-passes", "0"],
        stop_signal=signal.SIGKILL,
    )  # fmt: skip


async def _samples(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The worker's own queue, and how often its /metrics was read (the zone's scrapes)."""
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    found = {"waiting": 0.0, "scrapes": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gtm_gpusim_engine_state" and sample.labels["figure"] == "waiting":
                found["waiting"] = sample.value
            if sample.name == "gtm_gpusim_http_requests_total" and "metrics" in str(
                sample.labels.get("endpoint")
            ):
                found["scrapes"] += sample.value
    return found


async def _background(http: aiohttp.ClientSession, url: str) -> None:
    body = {"model": MODEL, "prompt": "word " * 500, "max_tokens": 4000}
    async with http.post(url + "/v1/completions", json=body) as response:
        await response.read()


@pytest.mark.parametrize("flavor", ["tgi", "trtllm", "llamacpp", "dynamo"])
async def test_the_zone_routes_around_a_queue_it_reads_from_the_engine_s_names(
    flavor: str,
) -> None:
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        busy = (await stack.enter_async_context(_worker(flavor))).url
        idle = (await stack.enter_async_context(_worker(flavor))).url
        zone_args = [
            "zone", "--zone", "zone-a", "--region", "region-1", "--listen", "127.0.0.1:0",
            "--scrape-interval", "0.1",
            "--worker", f"{busy},gpu=H100,id=gpu-a,model={MODEL}",
            "--worker", f"{idle},gpu=H100,id=gpu-b,model={MODEL}",
        ]  # fmt: skip
        zone = (await stack.enter_async_context(running(zone_args, stop_signal=signal.SIGKILL))).url
        group = await stack.enter_async_context(asyncio.TaskGroup())
        background = [group.create_task(_background(http, busy)) for _ in range(BACKGROUND)]
        try:
            async with asyncio.timeout(EVENTUALLY_S):
                queued = await _samples(http, busy)
                while queued["waiting"] < BACKGROUND - 1:  # polls an external server
                    queued = await _samples(http, busy)
                own_reads = 0
                while True:  # until the zone has scraped the queue twice since it formed
                    now = await _samples(http, busy)
                    own_reads += 1
                    if now["scrapes"] - queued["scrapes"] - own_reads >= 2:
                        break
                    await asyncio.sleep(0.02)
            served = []
            for index in range(CHATS):
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"question {index} of {flavor}"}],
                    "max_tokens": 2,
                }
                try:
                    async with http.post(
                        zone + "/v1/chat/completions", json=body, timeout=CHAT_TIMEOUT
                    ) as response:
                        assert response.status == 200, await response.text()
                        served.append(response.headers["x-gtm-gpu"])
                except TimeoutError:  # stuck behind gpu-a's queue
                    served.append("no answer in time")
            assert served == ["gpu-b"] * CHATS
        finally:
            for task in background:
                task.cancel()

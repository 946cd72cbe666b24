"""An operator runs ``gtm zone --kv-events`` in front of workers publishing vLLM's KV events.

Real processes on loopback, as an operator starts them: two ``gtm gpu-sim`` with vLLM's
``--kv-events-config`` (PUB and replay endpoints on ipc:// sockets, which vLLM binds like
its ``tcp://*`` default), and one ``gtm zone --kv-events`` whose ``--worker`` entries name
each worker's endpoints with the ``kv-events``/``kv-events-replay`` labels. The client
talks to the zone with plain HTTP, and reads where each request went (``x-gtm-gpu``):

1. a conversation's prompt goes to one GPU, its repeat to the same one (affinity);
2. other traffic, straight to the workers (another router in front of the same pool),
   caches the prompt on the second GPU and evicts it from the first;
3. once the zone has applied every event the workers published (their
   ``gtm_gpusim_kv_events_total`` against the zone's ``gtm_zone_kv_events_applied_total``),
   the conversation's next turn goes to the second GPU, where the prompt is cached.

Before, the zone agent knew only what it had sent where: the next turn went back to the
GPU that had evicted the prompt and was prefilled there from scratch.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gtm.net import free_port
from gtm.testing.processes import running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: Longest wait for the zone to apply the events the workers published.
EVENTS_WITHIN_S = 20.0
#: 128 KV blocks of 16 tokens: the other prompt leaves nothing of the conversation.
BLOCKS = "128"
CONVERSATION = " ".join(f"hello{i}" for i in range(300))  # ~600 tokens
OTHER = " ".join(f"other{i}" for i in range(900))  # ~1,800 tokens


def _gpu(tmp_path: Path, name: str) -> tuple[list[str], str, str]:
    endpoint, replay = f"ipc://{tmp_path}/{name}.pub", f"ipc://{tmp_path}/{name}.replay"
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay,
        "topic": "kv-events",
    }
    argv = [
        *("gpu-sim", "--port", "0", "--gpu-type", "H100", "--speedup", "100"),
        *("--model", MODEL, "--num-gpu-blocks", BLOCKS, "--warmup-passes", "0"),
        *("--kv-events-config", json.dumps(config)),
    ]
    return argv, endpoint, replay


async def _complete(http: aiohttp.ClientSession, url: str, prompt: str) -> str:
    """Send a completion; the GPU that served it (the zone's ``x-gtm-gpu``), if any."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return response.headers.get("x-gtm-gpu", "")


async def _samples(http: aiohttp.ClientSession, url: str, name: str) -> dict[str, float]:
    """Every sample of metric family ``name`` on ``url``/metrics, by its labels."""
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[json.dumps(sample.labels, sort_keys=True)] = sample.value
    return out


async def _zone_caught_up(http: aiohttp.ClientSession, zone: str, gpus: dict[str, str]) -> None:
    deadline = time.monotonic() + EVENTS_WITHIN_S
    while True:
        applied = await _samples(http, zone, "gtm_zone_kv_events_applied_total")
        done = True
        for gpu_id, url in gpus.items():
            published = sum((await _samples(http, url, "gtm_gpusim_kv_events_total")).values())
            done &= applied.get(json.dumps({"gpu": gpu_id})) == published
        if done:
            return
        assert time.monotonic() < deadline, "the zone never applied the workers' events"
        await asyncio.sleep(0.05)


async def test_the_next_turn_goes_where_the_engine_still_holds_the_prompt(
    tmp_path: Path,
) -> None:
    argv0, pub0, replay0 = _gpu(tmp_path, "gpu-0")
    argv1, pub1, replay1 = _gpu(tmp_path, "gpu-1")
    async with (
        running(argv0) as sim0,
        running(argv1) as sim1,
    ):
        gpu0, gpu1 = sim0.url, sim1.url
        gpus = {"gpu-0": gpu0, "gpu-1": gpu1}
        zone_argv = [
            *("zone", "--zone", "zone-a", "--region", "region-1"),
            *("--listen", f"127.0.0.1:{free_port('127.0.0.1')}"),
            "--worker",
            f"{gpu0},gpu=H100,id=gpu-0,label:kv-events={pub0},label:kv-events-replay={replay0}",
            "--worker",
            f"{gpu1},gpu=H100,id=gpu-1,label:kv-events={pub1},label:kv-events-replay={replay1}",
            *("--kv-events", "--kv-events-topic", "kv-events"),
        ]
        async with (
            running(zone_argv) as agent,
            aiohttp.ClientSession() as http,
        ):
            zone = agent.url
            home = await _complete(http, zone, CONVERSATION)
            assert home in gpus
            assert await _complete(http, zone, CONVERSATION) == home
            other = "gpu-1" if home == "gpu-0" else "gpu-0"
            await _complete(http, gpus[other], CONVERSATION)
            await _complete(http, gpus[home], OTHER)
            await _zone_caught_up(http, zone, gpus)
            assert await _complete(http, zone, CONVERSATION) == other

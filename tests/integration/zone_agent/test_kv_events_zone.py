"""gtm zone --kv-events in front of two gpu-sims publishing vLLM's KV events (loopback).

A conversation's prompt is sent through the agent to one GPU. Other traffic (another
router in front of the same pool) then brings the same prompt to the second GPU and
evicts it from the first. With the workers' KV events the agent sends the prompt's next
turn where it is cached; on its own record (today's agent, the control run here) it
keeps sending it to the GPU that evicted it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gpusim.server import GpuSimServer
from gtm.gpu_profiles import LLAMA_8B
from gtm.kv_events import KVEventsConfig
from gtm.metrics import new_registry
from zone_agent.app import ZoneAgent
from zone_agent.config import KVEventsSource, ZoneConfig, parse_worker

from .conftest import EVENTUALLY_S, FAST_HEALTH, sim_config

pytestmark = pytest.mark.integration

EVENTS = KVEventsConfig(
    enable_kv_cache_events=True,
    endpoint="tcp://127.0.0.1:*",
    replay_endpoint="tcp://127.0.0.1:*",
)
#: 128 blocks of 16 tokens: the other prompt (~1,800 tokens) leaves nothing of the first.
BLOCKS = 128


def _prompt(word: str, words: int) -> str:
    return " ".join(f"{word}{i}" for i in range(words))


CONVERSATION = _prompt("hello", 300)  # ~600 tokens
OTHER = _prompt("other", 900)  # ~1,800 tokens


@pytest.fixture
async def sims() -> AsyncIterator[list[GpuSimServer]]:
    started = []
    for _ in range(2):
        sim = GpuSimServer(
            sim_config("H100", models=(LLAMA_8B,), num_gpu_blocks=BLOCKS, kv_events=EVENTS),
            registry=new_registry(),
        )
        await sim.start()
        started.append(sim)
    yield started
    for sim in started:
        await sim.stop()


async def _agent(sims: list[GpuSimServer], *, kv_events: bool) -> ZoneAgent:
    workers = []
    for i, sim in enumerate(sims):
        publisher = sim.kv_events
        assert publisher is not None
        workers.append(
            parse_worker(
                f"{sim.url},gpu=H100,id=gpu-{i},label:kv-events={publisher.endpoint},"
                f"label:kv-events-replay={publisher.replay_endpoint}"
            )
        )
    config: dict[str, Any] = {
        "zone": "zone-a",
        "region": "region-1",
        "port": 0,
        "workers": tuple(workers),
        "health": FAST_HEALTH,
        "scrape_interval_s": 0.1,
        "kv_events": KVEventsSource() if kv_events else None,
    }
    agent = ZoneAgent(ZoneConfig.model_validate(config), registry=new_registry())
    await agent.start()
    return agent


async def _complete(http: aiohttp.ClientSession, url: str, prompt: str) -> None:
    body = {"model": LLAMA_8B, "prompt": prompt, "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()


def _served(agent: ZoneAgent) -> dict[str, float]:
    return {
        gpu: agent.registry.get_sample_value(
            "gtm_zone_assignments_total", {"gpu": gpu, "profile": agent.profile.name}
        )
        or 0.0
        for gpu in ("gpu-0", "gpu-1")
    }


async def _where(
    agent: ZoneAgent,
    http: aiohttp.ClientSession,
    prompt: str,
    via: str = "proxy",
    sims: list[GpuSimServer] | None = None,
) -> str:
    """The GPU the agent sends ``prompt`` to: through its proxy, or (``assign``) by
    asking ``/v1/assign`` and sending the request there ourselves, as a data plane in
    front of the agent does."""
    if via == "assign":
        assert sims is not None
        body = {"model": LLAMA_8B, "prompt": prompt, "max_tokens": 1}
        async with http.post(agent.url + "/v1/assign", json=body) as response:
            assert response.status == 200, await response.text()
            gpu = str((await response.json())["gpu"])
        await _complete(http, sims[int(gpu[-1])].url, prompt)
        return gpu
    before = _served(agent)
    await _complete(http, agent.url, prompt)
    after = _served(agent)
    (gpu,) = [g for g in after if after[g] > before[g]]
    return gpu


async def _events_applied(agent: ZoneAgent, sims: list[GpuSimServer]) -> None:
    """Until every worker's subscriber has applied every batch its publisher sent."""
    source = agent.kv_events
    assert source is not None
    deadline = asyncio.get_running_loop().time() + EVENTUALLY_S
    while asyncio.get_running_loop().time() < deadline:
        done = True
        for i, sim in enumerate(sims):
            publisher = sim.kv_events
            subscriber = source.subscriber(f"gpu-{i}")
            assert publisher is not None
            assert subscriber is not None
            done &= subscriber.last_seq >= publisher.sequence - 1
        if done:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the agent never caught up with the workers' events")


@pytest.mark.parametrize("via", ["proxy", "assign"])
@pytest.mark.parametrize("kv_events", [True, False], ids=["kv-events", "own-record"])
async def test_the_next_turn_goes_where_the_prefix_is_still_cached(
    sims: list[GpuSimServer], kv_events: bool, via: str
) -> None:
    agent = await _agent(sims, kv_events=kv_events)
    try:
        async with aiohttp.ClientSession() as http:
            home = await _where(agent, http, CONVERSATION, via, sims)
            other = "gpu-1" if home == "gpu-0" else "gpu-0"
            assert await _where(agent, http, CONVERSATION, via, sims) == home  # sticky
            # Other traffic, straight to the workers: the prompt reaches the other GPU,
            # and the home evicts it for a longer one.
            await _complete(http, sims[int(other[-1])].url, CONVERSATION)
            await _complete(http, sims[int(home[-1])].url, OTHER)
            if kv_events:
                await _events_applied(agent, sims)
                engine = agent.kv_events
                assert engine is not None
                assert engine.engine.evicted_blocks > 0
            chosen = await _where(agent, http, CONVERSATION, via, sims)
            if kv_events:
                assert chosen == other  # where the engine says the prefix is
            else:
                assert chosen == home  # the agent's guess: the GPU that evicted it
    finally:
        await agent.stop()

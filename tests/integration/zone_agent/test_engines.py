"""A zone agent in front of one emulated worker per engine flavour reads every worker's
load from that engine's own names, and routes over all of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from openai import AsyncOpenAI

from gpusim.metrics import MetricsFlavor
from gpusim.server import GpuSimServer
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from zone_agent.app import ZoneAgent
from zone_agent.config import ZoneConfig, parse_worker
from zone_agent.engines import Flavor

from .conftest import FAST_HEALTH, sim_config

pytestmark = pytest.mark.integration

CONCURRENT = 48


@dataclass
class MixedZone:
    agent: ZoneAgent
    client: AsyncOpenAI


@pytest.fixture
async def mixed_zone() -> AsyncIterator[MixedZone]:
    sims = [
        GpuSimServer(
            sim_config("H100", models=(LLAMA_8B,), metrics_flavor=flavor),
            registry=new_registry(),
        )
        for flavor in MetricsFlavor
    ]
    for sim in sims:
        await sim.start()
    workers = tuple(
        parse_worker(f"{sim.url},gpu=H100,id={flavor.value},model={LLAMA_8B}")
        for sim, flavor in zip(sims, MetricsFlavor, strict=True)
    )
    config = ZoneConfig.model_validate(
        {
            "zone": "zone-a",
            "region": "region-1",
            "port": 0,
            "workers": workers,
            "health": FAST_HEALTH,
            "scrape_interval_s": 0.1,
        }
    )
    agent = ZoneAgent(config, registry=new_registry())
    await agent.start()
    client = AsyncOpenAI(base_url=agent.url + "/v1", api_key="k", max_retries=0, timeout=20.0)
    try:
        yield MixedZone(agent, client)
    finally:
        await client.close()
        await agent.stop()
        for sim in sims:
            await sim.stop()


async def test_every_engine_s_load_is_read_and_routed_over(mixed_zone: MixedZone) -> None:
    agent = mixed_zone.agent
    view = await agent.refresh()
    flavors = {s.id: s.metrics.flavor for s in view.gpus if s.metrics is not None}
    assert flavors == {f.value: Flavor(f.value) for f in MetricsFlavor}
    index = view.by_model[LLAMA_8B]
    assert index.fresh.all(), dict(zip(index.ids, index.fresh.tolist(), strict=True))
    assert index.loaded.all()

    async def chat() -> None:
        response = await mixed_zone.client.chat.completions.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "hello " * 200}], max_tokens=8
        )
        assert response.choices[0].message.content

    async with asyncio.TaskGroup() as group:
        for _ in range(CONCURRENT):
            group.create_task(chat())
    served = {
        gpu: agent.registry.get_sample_value(
            "gtm_zone_assignments_total", {"gpu": gpu, "profile": agent.profile.name}
        )
        or 0.0
        for gpu in flavors
    }
    assert sum(served.values()) == CONCURRENT
    assert all(count > 0 for count in served.values()), served

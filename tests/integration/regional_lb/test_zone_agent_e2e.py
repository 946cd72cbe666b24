"""End to end on loopback: OpenAI SDK → regional LB → a real zone agent → an emulated GPU.

The zone agent publishes its zone summary into the shared store; the regional LB reads
it, chooses the zone and proxies to the agent (whose URL it is given with
``zone_urls``, as ``gtm regional --zone-url`` would).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import MappingProxyType

import pytest
from openai import AsyncOpenAI

from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from gtm.state.memory import MemoryStore
from regional_lb.view import ViewSettings
from tests.integration.regional_lb.conftest import RegionFactory, until
from tests.unit.regional_lb.policy_fixtures import KEYS
from zone_agent.app import ZoneAgent
from zone_agent.config import ZoneConfig, parse_worker

pytestmark = pytest.mark.integration


@pytest.fixture
async def zone_agent(store: MemoryStore) -> AsyncIterator[ZoneAgent]:
    sim = GpuSimServer(
        GpuSimConfig.model_validate(
            {
                "port": 0,
                "speedup": 1000.0,
                "gpu_type": "H100",
                "models": (LLAMA_8B,),
                "seed": 1,
                "warmup_passes": 0,
            }
        ),
        registry=new_registry(),
    )
    await sim.start()
    config = ZoneConfig.model_validate(
        {
            "zone": "us-east-a",
            "region": "us-east",
            "port": 0,
            "workers": (parse_worker(f"{sim.url},gpu=H100,id=gpu-0"),),
            "scrape_interval_s": 0.1,
            "summary_interval_s": 0.2,
        }
    )
    agent = ZoneAgent(config, registry=new_registry(), store=store)
    await agent.start()
    yield agent
    await agent.stop()
    await sim.stop()


async def test_a_request_goes_through_a_real_zone_agent_to_an_emulated_gpu(
    make_region: RegionFactory, zone_agent: ZoneAgent, clock: SystemClock
) -> None:
    region = await make_region(
        "us-east", view=ViewSettings(zone_urls=MappingProxyType({"us-east-a": zone_agent.url}))
    )
    await until(
        lambda: (
            (zone := region.service.view.zones.get("us-east-a")) is not None
            and zone.summary is not None
            and zone.summary.load_for(LLAMA_8B) is not None
        )
    )
    client = AsyncOpenAI(base_url=region.url + "/v1", api_key=KEYS["alpha"], max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "Say something."}], max_tokens=16
        )
        completion = raw.parse()
        stream = await client.chat.completions.create(
            model=LLAMA_8B,
            messages=[{"role": "user", "content": "Stream something."}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    assert completion.choices[0].message.content
    assert raw.headers["x-gtm-region"] == "us-east"
    assert raw.headers["x-gtm-zone"] == "us-east-a"
    assert raw.headers["x-gtm-gpu"] == "gpu-0"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert region.service.limiter.in_flight("alpha") == 0
    assert region.service.accounting.total_in_flight() == 0

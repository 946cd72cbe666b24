"""Workers registered in the state store, drains, and the zone summary under a lease."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpusim.server import GpuSimServer
from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget, ZoneSummary
from gtm.state import keys
from gtm.state.codec import decode, encode
from gtm.state.memory import MemoryStore

from .conftest import ZoneFactory, sim_config

pytestmark = pytest.mark.integration


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    memory = MemoryStore(SystemClock(), new_registry())
    yield memory
    await memory.aclose()


@pytest.fixture
async def registered(store: MemoryStore) -> AsyncIterator[list[GpuSimServer]]:
    """Two workers registered for zone-a and one for another zone."""
    sims = []
    for gpu_type, zone, worker_id in [
        ("H100", "zone-a", "sim-a1"),
        ("A100-80GB", "zone-a", "sim-a2"),
        ("H100", "zone-b", "sim-b1"),
    ]:
        config = sim_config(gpu_type, region="region-1", zone=zone, worker_id=worker_id)
        sim = GpuSimServer(config, registry=new_registry(), store=store)
        await sim.start()
        registration = sim.registration
        assert registration is not None
        await registration.registered.wait()
        sims.append(sim)
    yield sims
    for sim in sims:
        await sim.stop()


async def test_registered_workers_of_the_zone_are_discovered(
    make_zone: ZoneFactory, store: MemoryStore, registered: list[GpuSimServer]
) -> None:
    zone = await make_zone([], store=store)
    assert [g.id for g in zone.agent.view.gpus] == ["sim-a1", "sim-a2"]
    raw = await zone.client.chat.completions.with_raw_response.create(
        model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert raw.headers["x-gtm-gpu"] in ("sim-a1", "sim-a2")
    # A worker that leaves (its lease is revoked) leaves the view.
    await registered[1].stop()
    await zone.agent.refresh()
    assert [g.id for g in zone.agent.view.gpus] == ["sim-a1"]


async def test_a_drain_takes_the_gpu_out(
    make_zone: ZoneFactory, store: MemoryStore, registered: list[GpuSimServer]
) -> None:
    zone = await make_zone([], store=store)
    drain = Drain(target=DrainTarget.GPU, id="sim-a1", reason="maintenance")
    await store.put(keys.drain(DrainTarget.GPU, "sim-a1"), encode(drain))
    await zone.agent.refresh()
    gpu = zone.agent.view.gpu("sim-a1")
    assert gpu is not None
    assert gpu.unavailable_reason() == "drained by an operator"
    for _ in range(3):
        raw = await zone.client.chat.completions.with_raw_response.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert raw.headers["x-gtm-gpu"] == "sim-a2"


async def test_the_zone_summary_is_published_under_a_lease(
    make_zone: ZoneFactory, store: MemoryStore, registered: list[GpuSimServer]
) -> None:
    zone = await make_zone([], store=store)
    await zone.agent.publish_summary()
    kv = await store.get(keys.zone_summary("region-1", "zone-a"))
    assert kv is not None
    assert kv.lease != 0
    summary = decode(kv.key, kv.value, ZoneSummary)
    load = summary.load_for(LLAMA_8B)
    assert load is not None
    assert (load.gpus, load.healthy_gpus) == (2, 2)
    assert load.prefill_tokens_per_s > 0
    await zone.agent.stop()
    assert await store.get(keys.zone_summary("region-1", "zone-a")) is None

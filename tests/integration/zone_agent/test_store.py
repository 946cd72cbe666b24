"""Workers registered in the state store, drains, and the zone summary under a lease."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpusim.server import GpuSimServer
from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget, ZoneSummary
from gtm.policy_store import apply as policy_apply
from gtm.state import keys
from gtm.state.codec import decode, encode
from gtm.state.memory import MemoryStore
from policies.loader import examples_path, load_paths
from zone_agent.flow import AdmissionMode, AdmissionSettings

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


async def test_the_routing_profile_follows_the_policy_in_the_store(
    make_zone: ZoneFactory, store: MemoryStore, tmp_path: Path
) -> None:
    zone = await make_zone(["H100"], store=store)
    assert zone.agent.profile.weights == (("zone-ttft", 1.0), ("kv-cache", 1.0))
    # The example policy with its zone-default weighing KV room three times.
    for source in examples_path().glob("*.yaml"):
        text = source.read_text()
        if source.name == "routing-profiles.yaml":
            # zone-default's, then zone-goodput's: the first is replaced.
            assert text.count("{ref: kv-cache, weight: 1.0}") == 2
            assert text.index("name: zone-default") < text.index("name: zone-goodput")
            text = text.replace("{ref: kv-cache, weight: 1.0}", "{ref: kv-cache, weight: 3.0}", 1)
        (tmp_path / source.name).write_text(text)
    await policy_apply(store, load_paths([tmp_path]), 0, clock=SystemClock())
    watcher = zone.agent._policies
    assert watcher is not None
    await watcher.wait_for_generation(1)
    for _ in range(100):  # the follower runs on the next turns of the loop
        if zone.agent.profile.weights != (("zone-ttft", 1.0), ("kv-cache", 1.0)):
            break
        await asyncio.sleep(0)
    assert zone.agent.profile.weights == (("zone-ttft", 1.0), ("kv-cache", 3.0))


async def test_under_flow_control_a_policy_profile_without_a_ttft_prediction_is_refused(
    make_zone: ZoneFactory, store: MemoryStore, tmp_path: Path
) -> None:
    admission = AdmissionSettings(mode=AdmissionMode.SLO)
    zone = await make_zone(["H100"], store=store, admission=admission)
    in_force = zone.agent.profile
    blind = (
        "    - name: zone-default\n      tier: zone\n      filters: [health, model, fits, canary]\n"
        "      scorers:\n        - {ref: kv-cache, weight: 1.0}\n      picker: max-score\n"
    )
    for source in examples_path().glob("*.yaml"):
        text = source.read_text()
        if source.name == "routing-profiles.yaml":
            start = text.index("    - name: zone-default\n")
            end = text.index("    - name: zone-goodput\n")
            text = text[:start] + blind + text[end:]
        (tmp_path / source.name).write_text(text)
    await policy_apply(store, load_paths([tmp_path]), 0, clock=SystemClock())
    watcher = zone.agent._policies
    assert watcher is not None
    await watcher.wait_for_generation(1)
    labels = {"tier": "zone", "profile": "zone-default"}

    def refused() -> float:
        name = "gtm_routing_profile_reload_failures_total"
        return zone.agent.registry.get_sample_value(name, labels) or 0.0

    for _ in range(100):  # the follower runs on the next turns of the loop
        if refused():
            break
        await asyncio.sleep(0)
    assert refused() == 1.0
    assert zone.agent.profile is in_force  # flow control keeps its TTFT prediction

"""Cold start, registration in the state store (embedded and real etcd), and shutdown."""

from __future__ import annotations

import uuid

import httpx
import pytest

from gtm.clock import FakeClock, SystemClock
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry
from gtm.models import GpuWorker, WorkerState
from gtm.state import keys
from gtm.state.codec import decode
from gtm.state.etcd_server import EtcdServer
from gtm.state.memory import MemoryStore
from gtm.state.url import open_store
from gtm.tasks import TaskSupervisor

from .conftest import SimFactory

pytestmark = pytest.mark.integration

SPEEDUP = 100.0


async def _record(store: MemoryStore, key: str) -> GpuWorker | None:
    kv = await store.get(key)
    return None if kv is None else decode(kv.key, kv.value, GpuWorker)


async def test_cold_start_then_serving_and_registration_follow_the_load(
    make_sim: SimFactory,
) -> None:
    clock = FakeClock(start=0.0)
    store = MemoryStore(clock, new_registry())
    sim = await make_sim(
        clock=clock,
        store=store,
        speedup=SPEEDUP,
        cold_start=True,
        models=(LLAMA_8B,),
        region="eu-west",
        zone="eu-west-a",
        worker_id="gpu-7",
    )
    registration = sim.server.registration
    assert registration is not None
    await registration.registered.wait()
    key = keys.gpu("eu-west", "eu-west-a", "gpu-7")
    record = await _record(store, key)
    assert record is not None
    assert record.state is WorkerState.STARTING
    assert record.url == sim.url
    assert record.models == (LLAMA_8B,)
    assert record.gpu_type == "H100"

    health = await sim.http.get(sim.url + "/health")
    assert health.status_code == 503
    assert health.json()["status"] == "loading"
    assert (await sim.http.get(sim.url + "/readyz")).status_code == 503
    assert (await sim.http.get(sim.url + "/healthz")).status_code == 200  # alive while loading

    # A request sent while loading waits for the load, then is served.
    async with TaskSupervisor(registry=new_registry()) as supervisor:
        answer = supervisor.spawn(
            "chat",
            sim.client.chat.completions.create(
                model=LLAMA_8B,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                extra_body={"ignore_eos": True},
            ),
        )
        cold = get_profile("H100", LLAMA_8B).cold_start_s / SPEEDUP
        await clock.advance(cold * 0.9)
        assert not answer.done()
        while not answer.done():
            await clock.advance(0.01)
        response = answer.result()
    assert response.usage is not None
    assert response.usage.completion_tokens == 3
    assert (await sim.http.get(sim.url + "/health")).status_code == 200
    assert (await sim.http.get(sim.url + "/readyz")).status_code == 200

    await clock.advance(sim.server.config.lease_ttl_s)  # the next keep-alive rewrites it
    record = await _record(store, key)
    assert record is not None
    assert record.state is WorkerState.READY

    await sim.server.stop()
    assert await store.get(key) is None  # deregistered: the lease was revoked
    with pytest.raises(httpx.ConnectError):  # no longer listening
        await sim.http.get(sim.url + "/health")
    await store.aclose()


@pytest.mark.etcd
async def test_registers_in_real_etcd_and_deregisters_on_stop(
    make_sim: SimFactory, etcd_server: EtcdServer
) -> None:
    registry = new_registry()
    store = open_store(etcd_server.etcd_url, clock=SystemClock(), registry=registry)
    reader = open_store(etcd_server.etcd_url, clock=SystemClock(), registry=new_registry())
    worker = f"sim-{uuid.uuid4().hex[:8]}"
    sim = await make_sim(store=store, region="itest", zone="itest-a", worker_id=worker)
    registration = sim.server.registration
    assert registration is not None
    await registration.registered.wait()
    key = keys.gpu("itest", "itest-a", worker)
    kv = await reader.get(key)
    assert kv is not None
    assert kv.lease == registration.lease_id != 0
    record = decode(kv.key, kv.value, GpuWorker)
    assert record.url == sim.url
    assert record.state is WorkerState.READY
    await sim.server.stop()
    assert await reader.get(key) is None
    await store.aclose()
    await reader.aclose()

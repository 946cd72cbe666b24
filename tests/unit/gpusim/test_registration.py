"""Registration on the embedded store and a fake clock (the real-etcd run is in integration)."""

from __future__ import annotations

from gpusim.registration import WorkerRegistration
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.models import GpuWorker, WorkerState
from gtm.state import keys
from gtm.state.codec import decode
from gtm.state.memory import MemoryStore
from gtm.tasks import TaskSupervisor

RECORD = GpuWorker(
    id="sim-a100-1",
    zone_id="eu-west-a",
    region_id="eu-west",
    url="http://127.0.0.1:9000",
    gpu_type="A100-80GB",
    models=("meta-llama/Llama-3.1-8B-Instruct",),
)


async def test_register_keep_alive_update_recover_and_revoke() -> None:
    clock = FakeClock()
    registry = new_registry()
    store = MemoryStore(clock, registry)
    current = [RECORD]
    async with TaskSupervisor(registry=registry, clock=clock) as supervisor:
        registration = WorkerRegistration(store, lambda: current[0], supervisor=supervisor, ttl=3.0)
        assert registration.key == keys.gpu("eu-west", "eu-west-a", "sim-a100-1")
        registration.start()
        await registration.registered.wait()
        kv = await store.get(registration.key)
        assert kv is not None
        assert kv.lease == registration.lease_id
        assert decode(kv.key, kv.value, GpuWorker) == RECORD

        for _ in range(10):  # keep-alives every TTL/3 = 1 s keep it through 10 s
            await clock.advance(1.0)
        assert await store.get(registration.key) is not None

        current[0] = RECORD.model_copy(update={"state": WorkerState.DRAINING})
        await clock.advance(1.0)
        kv = await store.get(registration.key)
        assert kv is not None
        assert decode(kv.key, kv.value, GpuWorker).state is WorkerState.DRAINING

        lost = registration.lease_id
        await store.revoke_lease(lost)  # e.g. it expired while the store was unreachable
        assert await store.get(registration.key) is None
        await clock.advance(1.0)
        kv = await store.get(registration.key)
        assert kv is not None
        assert kv.lease == registration.lease_id != lost

        await registration.stop()
        assert await store.get(registration.key) is None
        assert registration.lease_id == 0
        await clock.advance(5.0)  # the loop does not come back after stop
        assert await store.get(registration.key) is None
        await registration.stop()  # idempotent
    await store.aclose()

import asyncio

import pytest

from gtm.clock import FakeClock
from gtm.errors import StateUnavailable
from gtm.state.memory import MemoryStore
from gtm.testing.outage import OutageStore


async def test_calls_fail_only_while_down(fake_clock: FakeClock) -> None:
    store = OutageStore(MemoryStore(fake_clock))
    revision = await store.put("/k", b"v")
    store.down = True
    with pytest.raises(StateUnavailable, match="simulated outage"):
        await store.get("/k")
    with pytest.raises(StateUnavailable):
        store.watch("/", start_revision=1)
    store.down = False
    kv = await store.get("/k")
    assert kv is not None
    assert kv.mod_revision == revision
    assert store.calls == 4


async def test_an_outage_ends_open_watches_and_a_new_watch_resumes(fake_clock: FakeClock) -> None:
    store = OutageStore(MemoryStore(fake_clock))
    first = await store.put("/a", b"1")
    watch = store.watch("/", start_revision=first)
    batch = await asyncio.wait_for(anext(watch), 5)
    assert [e.kv.key for e in batch.events] == ["/a"]
    pending = asyncio.ensure_future(anext(watch))  # noqa: TID251 - awaited below
    await asyncio.sleep(0)
    store.down = True
    with pytest.raises(StateUnavailable, match="watch stream lost"):
        await asyncio.wait_for(pending, 5)
    store.down = False
    second = await store.put("/b", b"2")
    resumed = store.watch("/", start_revision=first + 1)
    batch = await asyncio.wait_for(anext(resumed), 5)
    assert [(e.kv.key, e.kv.mod_revision) for e in batch.events] == [("/b", second)]
    await resumed.aclose()

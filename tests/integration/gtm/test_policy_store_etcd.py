"""Policy apply and hot reload against a real etcd (the unit suite uses MemoryStore)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gtm.clock import SystemClock
from gtm.metrics import new_registry
from gtm.policy_store import PolicyApplyConflict, PolicyWatcher, apply, load_from_store
from gtm.state.etcd_server import EtcdServer
from gtm.state.store import StateStore
from gtm.state.url import open_store
from gtm.tasks import TaskSupervisor
from policies.loader import examples_path, load_paths
from policies.policyset import PolicySet
from policies.residency import ResidencyQuery

pytestmark = [pytest.mark.etcd, pytest.mark.integration]


@pytest.fixture
async def store(own_etcd_server: EtcdServer) -> AsyncIterator[StateStore]:
    store = open_store(
        own_etcd_server.etcd_url, clock=SystemClock(), registry=new_registry(), timeout=2.0
    )
    yield store
    await store.aclose()


def examples_with(tmp_path: Path, old: str, new: str) -> PolicySet:
    target = tmp_path / "edited"
    target.mkdir()
    for source in examples_path().iterdir():
        (target / source.name).write_text(source.read_text().replace(old, new))
    return load_paths([target])


async def test_apply_commits_and_a_watcher_hot_reloads(store: StateStore, tmp_path: Path) -> None:
    clock = SystemClock()
    examples = load_paths([examples_path()])
    first = await apply(store, examples, 0, clock=clock, applied_by="test")
    assert first.generation == 1
    assert first.changed
    stored = await load_from_store(store)
    assert stored is not None
    assert stored.policy_set.digest == examples.digest

    registry = new_registry()
    watcher = PolicyWatcher(store, clock=clock, registry=registry)
    async with TaskSupervisor(registry=new_registry()) as tasks:
        tasks.spawn("policy-watcher", watcher.run())
        active = await asyncio.wait_for(watcher.wait_for_generation(1), 10)
        query = ResidencyQuery(
            tenant="demo-eu", model="meta-llama/Llama-3.1-8B-Instruct", client_country="US"
        )
        before = active.engine.allowed_regions(query)
        assert before.allowed == {"eu-west", "eu-central"}

        # A second generation narrows the EU tenant to Germany; the watcher picks it up.
        edited = examples_with(tmp_path, "      jurisdictions: [eu]\n", '      countries: ["DE"]\n')
        second = await apply(store, edited, 1, clock=clock, applied_by="test")
        assert second.generation == 2
        reloaded = await asyncio.wait_for(watcher.wait_for_generation(2), 10)
        after = reloaded.engine.allowed_regions(query)
    assert registry.get_sample_value("gtm_policy_revision") == 2.0
    assert after.allowed == {"eu-central"}
    assert reloaded.policy_set.digest == edited.digest


async def test_concurrent_applies_on_etcd_do_not_interleave(store: StateStore) -> None:
    clock = SystemClock()
    examples = load_paths([examples_path()])
    results = await asyncio.gather(
        *(apply(store, examples, 0, clock=clock, applied_by=f"op{i}") for i in range(4)),
        return_exceptions=True,
    )
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1, results
    assert all(isinstance(r, PolicyApplyConflict) for r in lost), lost
    stored = await load_from_store(store)
    assert stored is not None
    assert stored.generation == 1

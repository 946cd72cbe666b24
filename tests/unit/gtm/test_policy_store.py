from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gtm.clock import FakeClock
from gtm.errors import StateUnavailable
from gtm.metrics import new_registry
from gtm.policy_plan import Change
from gtm.policy_store import (
    GENERATION_KEY,
    LOCK_KEY,
    PolicyApplyConflict,
    PolicyDocumentRef,
    PolicyGeneration,
    PolicyStoreError,
    PolicyWatcher,
    StalePolicyRevision,
    activate,
    apply,
    load_from_store,
    plan_apply,
)
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtm.state.store import KeyValue, Lease, RangeResult, TxnResult, WatchBatch
from gtm.tasks import TaskSupervisor
from policies.loader import examples_path, load_paths
from policies.policyset import PolicySet


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock, new_registry())


@pytest.fixture(scope="module")
def examples() -> PolicySet:
    return load_paths([examples_path()])


def edited(tmp_path: Path, old: str, new: str, *, drop: str | None = None) -> PolicySet:
    """The examples with one text substitution (and optionally a file dropped)."""
    target = tmp_path / "edited"
    target.mkdir(exist_ok=True)
    for source in examples_path().iterdir():
        if source.name != drop:
            (target / source.name).write_text(source.read_text().replace(old, new))
    policy_set = load_paths([target])
    assert drop or policy_set.digest != load_paths([examples_path()]).digest
    return policy_set


class YieldingStore:
    """A MemoryStore that yields to the event loop before every call, so concurrent
    callers interleave the way they do against a remote etcd."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.before_put: asyncio.Event | None = None

    async def get(self, key: str) -> KeyValue | None:
        await asyncio.sleep(0)
        return await self.inner.get(key)

    async def range(self, prefix: str) -> RangeResult:
        await asyncio.sleep(0)
        return await self.inner.range(prefix)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        await asyncio.sleep(0)
        if self.before_put is not None:
            await self.before_put.wait()
        return await self.inner.put(key, value, lease=lease)

    async def delete(self, key: str) -> bool:
        await asyncio.sleep(0)
        return await self.inner.delete(key)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        await asyncio.sleep(0)
        return await self.inner.compare_and_swap(
            key, value, expected_mod_revision=expected_mod_revision, lease=lease
        )

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> TxnResult:
        await asyncio.sleep(0)
        return await self.inner.compare_and_delete(key, expected_mod_revision=expected_mod_revision)

    async def grant_lease(self, ttl: float) -> Lease:
        await asyncio.sleep(0)
        return await self.inner.grant_lease(ttl)

    async def keep_alive(self, lease_id: int) -> float:
        await asyncio.sleep(0)
        return await self.inner.keep_alive(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await asyncio.sleep(0)
        await self.inner.revoke_lease(lease_id)

    async def current_revision(self) -> int:
        return await self.inner.current_revision()

    async def compact(self, revision: int) -> None:
        await self.inner.compact(revision)

    def watch(self, prefix: str, *, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        return self.inner.watch(prefix, start_revision=start_revision)

    async def aclose(self) -> None:
        await self.inner.aclose()


# ---------------------------------------------------------------------------- apply


async def test_apply_writes_every_document_and_commits(
    store: MemoryStore, clock: FakeClock, examples: PolicySet
) -> None:
    assert await load_from_store(store) is None
    result = await apply(store, examples, 0, clock=clock, applied_by="alice")
    assert (result.generation, result.changed) == (1, True)
    assert result.written == len(examples.documents)
    listing = await store.range(keys.prefix(keys.Kind.POLICY))
    assert keys.policy("Residency", "example-residency") in {kv.key for kv in listing.kvs}
    assert await store.get(LOCK_KEY) is None  # the lock is released
    commit = await store.get(GENERATION_KEY)
    assert commit is not None
    record = codec.decode(GENERATION_KEY, commit.value, PolicyGeneration)
    assert (record.generation, record.digest, record.applied_by) == (1, examples.digest, "alice")
    assert record.applied_at == clock.wall()
    stored = await load_from_store(store)
    assert stored is not None
    assert (stored.generation, stored.policy_set.digest) == (1, examples.digest)


async def test_reapplying_the_same_policies_changes_nothing(
    store: MemoryStore, clock: FakeClock, examples: PolicySet
) -> None:
    await apply(store, examples, None, clock=clock)
    revision = await store.current_revision()
    result = await apply(store, examples, 1, clock=clock)
    assert (result.generation, result.changed) == (1, False)
    assert (await store.get(GENERATION_KEY)) is not None
    # Only the lock came and went.
    assert await store.current_revision() == revision + 2


async def test_a_stale_expected_revision_is_refused(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, tmp_path: Path
) -> None:
    await apply(store, examples, 0, clock=clock)
    changed = edited(tmp_path, "Dublin", "Dublin, Ireland")
    before = await store.range(keys.prefix(keys.Kind.POLICY))
    with pytest.raises(StalePolicyRevision, match="at generation 1, not 0") as info:
        await apply(store, changed, 0, clock=clock)
    assert (info.value.expected, info.value.current) == (0, 1)
    after = await store.range(keys.prefix(keys.Kind.POLICY))
    assert after.kvs == before.kvs


async def test_next_generation_writes_changes_and_deletes_dropped_documents(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, tmp_path: Path
) -> None:
    await apply(store, examples, 0, clock=clock)
    smaller = edited(tmp_path, "de-only", "de-only", drop="routing-profiles.yaml")
    result = await apply(store, smaller, 1, clock=clock)
    assert (result.generation, result.written, result.deleted) == (2, 0, 1)
    assert await store.get(keys.policy("RoutingProfiles", "example-routing")) is None
    stored = await load_from_store(store)
    assert stored is not None
    assert stored.policy_set.digest == smaller.digest
    assert not stored.policy_set.profiles


async def test_concurrent_applies_cannot_interleave(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, tmp_path: Path
) -> None:
    yielding = YieldingStore(store)
    other = edited(tmp_path, "Dublin", "Dublin, Ireland")
    results = await asyncio.gather(
        apply(yielding, examples, None, clock=clock),
        apply(yielding, other, None, clock=clock),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1
    assert len(losers) == 1
    assert isinstance(losers[0], PolicyApplyConflict)
    assert "another policy apply holds" in str(losers[0])
    stored = await load_from_store(store)
    assert stored is not None
    winner_digest = examples.digest if results[0] is winners[0] else other.digest
    assert (stored.generation, stored.policy_set.digest) == (1, winner_digest)


async def test_a_crashed_apply_releases_the_lock_when_its_lease_expires(
    store: MemoryStore, clock: FakeClock, examples: PolicySet
) -> None:
    lease = await store.grant_lease(30)
    await store.put(LOCK_KEY, b"{}", lease=lease.id)  # an apply that died holding the lock
    with pytest.raises(PolicyApplyConflict, match="releases it within 30 s"):
        await apply(store, examples, 0, clock=clock)
    clock.advance_nowait(31)
    assert (await apply(store, examples, 0, clock=clock)).generation == 1


async def test_losing_the_lock_mid_apply_commits_nothing(
    store: MemoryStore, clock: FakeClock, examples: PolicySet
) -> None:
    class LosesLock(YieldingStore):
        async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
            revision = await super().put(key, value, lease=lease)
            lock = await self.inner.get(LOCK_KEY)
            assert lock is not None
            await self.inner.revoke_lease(lock.lease)
            return revision

    with pytest.raises(PolicyApplyConflict, match="lock expired while writing"):
        await apply(LosesLock(store), examples, 0, clock=clock)
    assert await store.get(GENERATION_KEY) is None


class CommitFails(YieldingStore):
    """The store goes away as the apply commits: its documents are written, its commit not."""

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        if key == GENERATION_KEY:
            raise StateUnavailable("etcd went away")
        return await super().compare_and_swap(
            key, value, expected_mod_revision=expected_mod_revision, lease=lease
        )


def stored_values(listing: RangeResult) -> dict[str, bytes]:
    return {kv.key: kv.value for kv in listing.kvs if kv.key != LOCK_KEY}


async def test_a_failed_apply_puts_back_what_it_overwrote(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, tmp_path: Path
) -> None:
    await apply(store, examples, 0, clock=clock)
    before = stored_values(await store.range(keys.prefix(keys.Kind.POLICY)))
    target = tmp_path / "bigger"  # one document overwritten, one added
    target.mkdir()
    for source in examples_path().iterdir():
        text = source.read_text().replace("Dublin", "Dublin, Ireland")
        (target / source.name).write_text(text.replace("example-tenants", "more-tenants"))
    bigger = load_paths([target])
    with pytest.raises(StateUnavailable):
        await apply(CommitFails(store), bigger, 1, clock=clock)
    # The overwritten document is back and the added one gone: generation 1 still loads
    # (before, a tier starting now found it "changed" and had no policy).
    assert stored_values(await store.range(keys.prefix(keys.Kind.POLICY))) == before
    stored = await load_from_store(store)
    assert stored is not None
    assert (stored.generation, stored.policy_set.digest) == (1, examples.digest)


async def test_plan_apply_keeps_or_prunes_and_reads_the_commit_only(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, tmp_path: Path
) -> None:
    empty = await plan_apply(store, examples.documents, prune=False)
    assert (empty.base_generation, len(empty.of(Change.ADDED))) == (0, 6)
    await apply(store, examples, 0, clock=clock)
    changed = edited(tmp_path, "Dublin", "Dublin, Ireland", drop="routing-profiles.yaml")
    plan = await plan_apply(store, changed.documents, prune=False)
    assert plan.base_generation == 1
    assert [c.ref for c in plan.of(Change.CHANGED)] == ["Regions/example-regions"]
    assert [c.ref for c in plan.of(Change.KEPT)] == ["RoutingProfiles/example-routing"]
    assert plan.policy_set.profiles
    assert await store.get(LOCK_KEY) is None  # planning takes no lock, writes nothing
    # A committed document that changed under the commit: only --prune can go on.
    await store.put(keys.policy("Regions", "example-regions"), b"{}")
    with pytest.raises(
        PolicyStoreError, match=r"which is changed .*apply the whole set with --prune"
    ):
        await plan_apply(store, changed.documents, prune=False)
    pruned = await plan_apply(store, changed.documents, prune=True)
    assert [c.ref for c in pruned.of(Change.DELETED)] == ["RoutingProfiles/example-routing"]


class PausesAfterFirstPut(YieldingStore):
    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.first_written = asyncio.Event()
        self.resume = asyncio.Event()

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        revision = await super().put(key, value, lease=lease)
        if not self.first_written.is_set():
            self.first_written.set()
            await self.resume.wait()
        return revision


async def test_readers_never_see_a_half_applied_generation(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, tmp_path: Path
) -> None:
    await apply(store, examples, 0, clock=clock)
    registry = new_registry()
    watcher = PolicyWatcher(store, clock=clock, registry=registry)
    assert await watcher.reload()
    changed = edited(tmp_path, "Dublin", "Dublin, Ireland")
    paused = PausesAfterFirstPut(store)
    async with TaskSupervisor(registry=registry, clock=clock) as supervisor:
        writer = supervisor.spawn("apply", apply(paused, changed, 1, clock=clock))
        await paused.first_written.wait()
        with pytest.raises(PolicyStoreError, match="which is changed \\(an apply is in progress"):
            await load_from_store(store)
        assert not await watcher.reload()
        assert watcher.current is not None
        assert watcher.current.policy_set.digest == examples.digest
        paused.resume.set()
        assert (await writer).generation == 2
    assert await watcher.reload()
    assert watcher.current.policy_set.digest == changed.digest


# ---------------------------------------------------------------------------- watcher


def sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


async def test_watcher_swaps_on_each_commit(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, tmp_path: Path
) -> None:
    registry = new_registry()
    watcher = PolicyWatcher(store, clock=clock, registry=registry)
    assert watcher.current is None
    assert sample(registry, "gtm_policy_revision") == 0
    async with TaskSupervisor(registry=registry, clock=clock) as supervisor:
        supervisor.spawn("policy-watch", watcher.run())
        await apply(store, examples, 0, clock=clock)
        first = await watcher.wait_for_generation(1)
        assert first.policy_set.digest == examples.digest
        assert first.tenants.authenticate("gtm-demo-eu").id == "demo-eu"
        assert sample(registry, "gtm_policy_revision") == 1
        assert sample(registry, "gtm_policy_last_reload_success_timestamp_seconds") == clock.wall()
        changed = edited(tmp_path, "Dublin", "Dublin, Ireland")
        clock.advance_nowait(5)
        await apply(store, changed, 1, clock=clock)
        second = await watcher.wait_for_generation(2)
        assert second.policy_set.digest == changed.digest
        assert second.revision == f"2-{changed.digest[:12]}"
        assert sample(registry, "gtm_policy_last_reload_success_timestamp_seconds") == clock.wall()
        assert sample(registry, "gtm_policy_reload_failures_total") == 0


async def test_an_invalid_generation_keeps_the_last_good_policy(
    store: MemoryStore, clock: FakeClock, examples: PolicySet, caplog: pytest.LogCaptureFixture
) -> None:
    registry = new_registry()
    await apply(store, examples, 0, clock=clock)
    watcher = PolicyWatcher(store, clock=clock, registry=registry)
    assert await watcher.reload()
    good = watcher.current
    assert good is not None
    # Someone bypasses `gtm policy apply` and commits a document that does not validate.
    bad_value = b'{"apiVersion":"gtm.dev/v1","kind":"Tenants","metadata":{"name":"x"},"spec":{}}'
    await store.put(keys.policy("Tenants", "x"), bad_value)
    ref = PolicyDocumentRef(kind="Tenants", name="x", sha256=hashlib.sha256(bad_value).hexdigest())
    commit = await store.get(GENERATION_KEY)
    assert commit is not None
    record = codec.decode(GENERATION_KEY, commit.value, PolicyGeneration)
    broken = record.model_copy(update={"generation": 2, "documents": (*record.documents, ref)})
    await store.put(GENERATION_KEY, codec.encode(broken))
    assert not await watcher.reload()
    assert watcher.current is good
    assert sample(registry, "gtm_policy_reload_failures_total") == 1
    assert sample(registry, "gtm_policy_revision") == 1
    assert "policy reload failed; keeping generation 1" in caplog.text
    assert "spec.tenants: required field is missing" in caplog.text


async def test_watcher_reports_an_unreachable_store(store: MemoryStore, clock: FakeClock) -> None:
    watcher = PolicyWatcher(store, clock=clock, registry=new_registry())
    await store.aclose()
    with pytest.raises(StateUnavailable):
        await watcher.reload()


def test_activate_and_initial_policy(
    examples: PolicySet, clock: FakeClock, store: MemoryStore
) -> None:
    active = activate(7, examples)
    registry = new_registry()
    watcher = PolicyWatcher(store, clock=clock, registry=registry, initial=active)
    assert watcher.current is active
    assert sample(registry, "gtm_policy_revision") == 7
    assert active.engine.digest == examples.digest

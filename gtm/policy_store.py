"""Policies in the state store: ``apply`` with compare-and-swap, and a watcher that
hot-swaps the compiled policy.

Layout (keys from :func:`gtm.state.keys.policy`)::

    /gtm/v1/policies/{Kind}/{name}         one document, canonical JSON
    /gtm/v1/policies/meta/generation       PolicyGeneration: the commit record
    /gtm/v1/policies/meta/apply-lock       held (under a lease) while an apply writes

The store has single-key compare-and-swap but no multi-key transaction, so an apply
is: take the lock (CAS on "absent", attached to a lease so a crashed apply releases
it), check the caller's expected generation, write the documents, then commit by CAS
on the generation key's ``mod_revision`` — the commit names every document with its
sha256 and the policy set's digest. Two concurrent applies cannot interleave: the
second fails to take the lock, and even if a lock expired mid-apply, the commit CAS
fails for whoever lost. Readers trust only what a commit names and re-check every
hash, so a reader that looks while an apply is writing sees a mismatch and keeps the
policy it has. Documents the new set drops are deleted after the commit. An apply that
fails after writing and before committing puts back what it overwrote while it still
holds the lock, so the committed generation stays readable.

:func:`apply` makes the policy set it is given the whole next generation. ``gtm policy
apply`` first asks :func:`plan_apply` what applying some documents over the committed
generation means (:mod:`gtm.policy_plan`: kept unless pruned), shows it, and applies the
plan's set with the plan's generation as the expected one, so what it showed is what it
commits — or nothing, if someone applied in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field

from gtm.clock import Clock
from gtm.errors import CompactedError, LeaseNotFound, StateError, StateUnavailable
from gtm.models import Frozen, NonNegFloat, StoredRecord
from gtm.outage import OutageLog
from gtm.policy_plan import ApplyPlan, plan_changes
from gtm.state import codec, keys
from gtm.state.store import KeyValue, StateStore
from gtm.tasks import Backoff
from policies.errors import PolicyError, PolicyValidationError
from policies.loader import Format, load_bytes
from policies.policyset import LoadedDocument, PolicySet, build_policy_set, document_json
from policies.residency import ResidencyEngine, compile
from policies.tenants import TenantDirectory

log = logging.getLogger(__name__)

META = "meta"
GENERATION_KEY = keys.policy(META, "generation")
LOCK_KEY = keys.policy(META, "apply-lock")
POLICY_PREFIX = keys.prefix(keys.Kind.POLICY)

#: Lock lease TTL, seconds. An apply writes a few documents in well under a second; a
#: crashed apply blocks the next one for at most this long.
DEFAULT_LOCK_TTL = 30.0


class PolicyStoreError(StateError):
    """The policies in the store cannot be applied or read."""


class PolicyApplyConflict(PolicyStoreError):
    """Another apply holds the lock or committed first; nothing of ours was committed."""


class StalePolicyRevision(PolicyApplyConflict):
    """The store's policy generation is not the one the caller expected."""

    def __init__(self, expected: int, current: int) -> None:
        super().__init__(
            f"policies are at generation {current}, not {expected} as expected: someone "
            "applied in between; review their change and retry with "
            f"--expected-revision {current}"
        )
        self.expected = expected
        self.current = current


class PolicyDocumentRef(Frozen):
    kind: str = Field(min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=128)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class PolicyGeneration(StoredRecord):
    """The commit record of one applied policy set."""

    generation: int = Field(ge=1)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    documents: tuple[PolicyDocumentRef, ...]
    applied_at: NonNegFloat = 0.0
    applied_by: str = Field(default="", max_length=256)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    generation: int
    changed: bool
    written: int = 0
    deleted: int = 0
    #: The store revision of the commit (0: nothing was committed).
    revision: int = 0


def _doc_key(doc: LoadedDocument) -> str:
    return keys.policy(doc.kind.value, doc.name)


async def apply(
    store: StateStore,
    policy_set: PolicySet,
    expected_revision: int | None,
    *,
    clock: Clock,
    applied_by: str = "",
    lock_ttl: float = DEFAULT_LOCK_TTL,
) -> ApplyResult:
    """Write a validated policy set and commit it as the next generation.

    Args:
        expected_revision: the generation the caller's change is based on (0: nothing
            applied yet); ``None`` applies over whatever is current.

    Raises:
        StalePolicyRevision: the current generation is not ``expected_revision``.
        PolicyApplyConflict: another apply is running or committed first.
        StateUnavailable: the store cannot be reached (nothing was committed).
    """
    lease = await store.grant_lease(lock_ttl)
    try:
        owner = codec.encode(_LockRecord(applied_by=applied_by, started_at=clock.wall()))
        taken = await store.compare_and_swap(
            LOCK_KEY, owner, expected_mod_revision=0, lease=lease.id
        )
        if not taken.succeeded:
            raise PolicyApplyConflict(
                f"another policy apply holds {LOCK_KEY}; retry when it finishes "
                f"(a crashed apply releases it within {lock_ttl:g} s)"
            )
        return await _apply_locked(
            store, policy_set, expected_revision, lease.id, clock, applied_by
        )
    finally:
        try:
            await store.revoke_lease(lease.id)
        except StateError:
            log.warning("could not release the policy apply lock; it expires in %g s", lock_ttl)


class _LockRecord(StoredRecord):
    applied_by: str = Field(default="", max_length=256)
    started_at: NonNegFloat = 0.0


async def _apply_locked(
    store: StateStore,
    policy_set: PolicySet,
    expected_revision: int | None,
    lease_id: int,
    clock: Clock,
    applied_by: str,
) -> ApplyResult:
    current_kv = await store.get(GENERATION_KEY)
    current = (
        codec.decode(GENERATION_KEY, current_kv.value, PolicyGeneration) if current_kv else None
    )
    current_generation = current.generation if current else 0
    if expected_revision is not None and expected_revision != current_generation:
        raise StalePolicyRevision(expected_revision, current_generation)
    if current is not None and current.digest == policy_set.digest:
        return ApplyResult(current_generation, changed=False)
    listing = await store.range(POLICY_PREFIX)
    existing = {kv.key: kv.value for kv in listing.kvs}
    refs = []
    overwritten: dict[str, bytes | None] = {}
    try:
        for doc in policy_set.documents:
            key, value = _doc_key(doc), document_json(doc.document)
            refs.append(PolicyDocumentRef(kind=doc.kind.value, name=doc.name, sha256=_sha(value)))
            if existing.get(key) != value:
                await _still_locked(store, lease_id)
                overwritten[key] = existing.get(key)
                await store.put(key, value)
        record = PolicyGeneration(
            generation=current_generation + 1,
            digest=policy_set.digest,
            documents=tuple(refs),
            applied_at=clock.wall(),
            applied_by=applied_by,
        )
        await _still_locked(store, lease_id)
        committed = await store.compare_and_swap(
            GENERATION_KEY,
            codec.encode(record),
            expected_mod_revision=current_kv.mod_revision if current_kv else 0,
        )
        if not committed.succeeded:
            raise PolicyApplyConflict("another apply committed first; nothing was committed")
    except StateError:
        await _put_back(store, lease_id, overwritten)
        raise
    keep = {_doc_key(d) for d in policy_set.documents} | {GENERATION_KEY, LOCK_KEY}
    deleted = 0
    for key in existing.keys() - keep:
        deleted += await store.delete(key)
    return ApplyResult(
        record.generation,
        changed=True,
        written=len(overwritten),
        deleted=deleted,
        revision=committed.revision,
    )


async def _put_back(store: StateStore, lease_id: int, overwritten: dict[str, bytes | None]) -> None:
    """Undo the writes of an apply that did not commit, while it still holds the lock
    (once the lock is gone, another apply may be writing those keys). Best effort: a
    store that failed the apply may fail this too; readers still trust only what the
    commit names, and say so when a named document changed."""
    if not overwritten:
        return
    try:
        await store.keep_alive(lease_id)
        for key, value in overwritten.items():
            if value is None:
                await store.delete(key)
            else:
                await store.put(key, value)
    except StateError as exc:
        log.warning(
            "a failed policy apply could not put back %d document(s) it overwrote: %s",
            len(overwritten),
            exc,
        )


async def _still_locked(store: StateStore, lease_id: int) -> None:
    try:
        await store.keep_alive(lease_id)
    except LeaseNotFound:
        raise PolicyApplyConflict(
            "the apply lock expired while writing; nothing was committed — retry"
        ) from None


def _sha(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


async def plan_apply(
    store: StateStore, given: Sequence[LoadedDocument], *, prune: bool
) -> ApplyPlan:
    """What applying ``given`` over the committed generation would change
    (:func:`gtm.policy_plan.plan_changes`); reads, never writes.

    Raises:
        PolicyStoreError: without ``prune``, the committed generation cannot be read
            (its documents are needed for the next one).
        PolicyValidationError / PolicyConflictError: the next generation does not
            validate as a whole.
        StateUnavailable: the store cannot be reached.
    """
    listing = await store.range(POLICY_PREFIX)
    values = {kv.key: kv for kv in listing.kvs}
    stored = {
        (parsed.parts[0], parsed.parts[1]): kv.value
        for kv in listing.kvs
        if (parsed := keys.parse(kv.key)) is not None and parsed.parts[0] != META
    }
    commit = values.get(GENERATION_KEY)
    record = codec.decode(GENERATION_KEY, commit.value, PolicyGeneration) if commit else None
    committed: list[LoadedDocument] = []
    if record is not None:
        try:
            committed = [_stored_document(values, record, ref) for ref in record.documents]
        except PolicyStoreError as exc:
            if not prune:
                raise PolicyStoreError(
                    f"{exc}; the documents of generation {record.generation} are needed to "
                    "keep the ones not given — apply the whole set with --prune"
                ) from None
            committed = []  # with prune every stored document not given is deleted
    return plan_changes(
        committed,
        stored,
        given,
        prune=prune,
        base_generation=record.generation if record else 0,
        base_revision=listing.revision,
        named={(ref.kind, ref.name) for ref in record.documents} if record else set(),
    )


@dataclass(frozen=True, slots=True)
class CommittedDocument:
    kind: str
    name: str
    value: bytes  # canonical JSON, as stored


async def committed_documents(store: StateStore) -> tuple[int, tuple[CommittedDocument, ...]]:
    """The committed generation and its documents' stored JSON, hashes checked
    (``(0, ())`` before any apply).

    Raises:
        PolicyStoreError: the commit names a missing or changed document.
    """
    listing = await store.range(POLICY_PREFIX)
    values = {kv.key: kv for kv in listing.kvs}
    commit = values.get(GENERATION_KEY)
    if commit is None:
        return 0, ()
    record = codec.decode(GENERATION_KEY, commit.value, PolicyGeneration)
    documents = []
    for ref in record.documents:
        _stored_document(values, record, ref)  # checks presence and hash
        value = values[keys.policy(ref.kind, ref.name)].value
        documents.append(CommittedDocument(ref.kind, ref.name, value))
    return record.generation, tuple(documents)


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class ActivePolicy:
    """One committed generation, compiled: what the tiers consult per request."""

    generation: int
    policy_set: PolicySet
    engine: ResidencyEngine
    tenants: TenantDirectory

    @property
    def revision(self) -> str:
        """``<generation>-<digest prefix>``: the ``policy_revision`` of audit records."""
        return f"{self.generation}-{self.policy_set.digest[:12]}"


def activate(generation: int, policy_set: PolicySet) -> ActivePolicy:
    return ActivePolicy(
        generation, policy_set, compile(policy_set), TenantDirectory(policy_set.tenants)
    )


@dataclass(frozen=True, slots=True)
class StoredPolicy:
    generation: int
    store_revision: int
    policy_set: PolicySet


async def load_from_store(store: StateStore) -> StoredPolicy | None:
    """The committed policy set, read at one store revision; ``None`` if none was applied.

    Raises:
        PolicyStoreError: the commit names a document that is missing or changed (an
            apply is in progress), or the documents do not validate.
    """
    listing = await store.range(POLICY_PREFIX)
    values = {kv.key: kv for kv in listing.kvs}
    commit = values.get(GENERATION_KEY)
    if commit is None:
        return None
    record = codec.decode(GENERATION_KEY, commit.value, PolicyGeneration)
    documents = [_stored_document(values, record, ref) for ref in record.documents]
    try:
        policy_set = build_policy_set(documents)
    except PolicyValidationError as exc:
        raise PolicyStoreError(
            f"generation {record.generation} does not validate:\n{exc}"
        ) from None
    if policy_set.digest != record.digest:
        raise PolicyStoreError(f"generation {record.generation}: digest mismatch")
    return StoredPolicy(record.generation, listing.revision, policy_set)


def _stored_document(
    values: dict[str, KeyValue], record: PolicyGeneration, ref: PolicyDocumentRef
) -> LoadedDocument:
    key = keys.policy(ref.kind, ref.name)
    kv = values.get(key)
    if kv is None or _sha(kv.value) != ref.sha256:
        state = "missing" if kv is None else "changed"
        raise PolicyStoreError(
            f"generation {record.generation} names {key}, which is {state} "
            "(an apply is in progress?)"
        )
    try:
        (doc,) = load_bytes(kv.value, key, Format.JSON)
    except (PolicyError, ValueError) as exc:
        raise PolicyStoreError(f"{key} is not a valid policy document: {exc}") from None
    return doc


class PolicyWatcher:
    """Keeps :attr:`current` at the last good committed policy; run :meth:`run` as a
    supervised task. An invalid generation is logged and counted and the previous
    policy stays in force.

    Metrics (on the injected registry):

    * ``gtm_policy_revision`` — generation in force (0 before any);
    * ``gtm_policy_reload_failures_total`` — generations that could not be loaded;
    * ``gtm_policy_last_reload_success_timestamp_seconds`` — wall time of the last
      successful load.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        clock: Clock,
        registry: CollectorRegistry,
        initial: ActivePolicy | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._backoff = backoff or Backoff(initial=0.1, maximum=5.0)
        self._rng = rng or random.Random()
        self._current = initial
        self._changed = asyncio.Condition()
        self._loaded_revision = 0
        self._m_generation = Gauge(
            "gtm_policy_revision", "Policy generation in force (0: none).", registry=registry
        )
        self._m_failures = Counter(
            "gtm_policy_reload_failures_total",
            "Policy generations that failed to load; the previous policy stayed in force.",
            registry=registry,
        )
        self._m_success = Gauge(
            "gtm_policy_last_reload_success_timestamp_seconds",
            "Wall-clock time of the last successful policy load.",
            registry=registry,
        )
        self._m_store_failures = Counter(
            "gtm_policy_watch_failures_total",
            "Failed attempts to read or watch the policy in the store (the policy in force "
            "stays; the log says when the store went away and when it is back).",
            registry=registry,
        )
        self._outage = OutageLog(
            "policy watch",
            logger=log,
            clock=clock,
            count=self._m_store_failures.inc,
            consequence="serving the policy in force",
        )
        if initial is not None:
            self._m_generation.set(initial.generation)

    @property
    def current(self) -> ActivePolicy | None:
        return self._current

    async def wait_for_generation(self, generation: int) -> ActivePolicy:
        """Wait until a generation ≥ ``generation`` is in force."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._current is not None and self._current.generation >= generation
            )
        assert self._current is not None
        return self._current

    async def reload(self) -> bool:
        """Load the committed generation; ``True`` if it is now in force.

        Raises only StateUnavailable (the store is unreachable); invalid policies are
        counted and logged, never raised.
        """
        try:
            stored = await load_from_store(self._store)
        except StateUnavailable:
            raise
        except (PolicyStoreError, StateError) as exc:
            self._m_failures.inc()
            kept = self._current.generation if self._current else "none"
            log.error("policy reload failed; keeping generation %s: %s", kept, exc)
            return False
        if stored is None:
            self._loaded_revision = await self._store.current_revision()
            return False
        self._loaded_revision = stored.store_revision
        if self._current is None or self._current.generation != stored.generation:
            await self._publish(activate(stored.generation, stored.policy_set))
        self._m_success.set(self._clock.wall())
        return True

    async def _publish(self, active: ActivePolicy) -> None:
        self._current = active  # one reference assignment: readers see old or new, whole
        self._m_generation.set(active.generation)
        log.info(
            "policy generation %d in force (digest %s)",
            active.generation,
            active.policy_set.digest[:12],
        )
        async with self._changed:
            self._changed.notify_all()

    async def run(self) -> None:
        """Load, then reload on every commit; re-list after compaction, back off while
        the store is unreachable. Never returns; cancel it to stop."""
        while True:
            try:
                await self.reload()
                self._outage.recovered()
                await self._follow()
            except CompactedError as exc:
                log.warning("policy watch fell behind compaction (%s); re-listing", exc)
            except StateUnavailable as exc:
                self._outage.failed(exc)
                attempt = self._outage.attempts - 1
                await self._clock.sleep(self._backoff.delay(attempt, self._rng))

    async def _follow(self) -> None:
        start = self._loaded_revision + 1
        watch = self._store.watch(POLICY_PREFIX, start_revision=start)
        async with contextlib.aclosing(watch) as batches:
            async for batch in batches:
                if any(event.kv.key == GENERATION_KEY for event in batch.events):
                    await self.reload()

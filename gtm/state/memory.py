"""The embedded state store: etcd's semantics in one process, for single-process ``gtm up``
and as the verified fake that the contract suite runs side by side with real etcd.

What it keeps, and why it is bounded:

* the current key-value map, plus a sorted key list so ``range(prefix)`` is a bisect;
* the change history — one entry per revision — so ``watch`` can replay from any kept
  revision. History is bounded (``history_limit`` revisions, default
  :data:`DEFAULT_HISTORY_LIMIT`): older entries are compacted automatically, like etcd
  with auto-compaction on, and a watch asking for them raises CompactedError.

Watchers do not have queues of their own. Each one is a cursor into the shared history
that wakes when a write lands, so a writer never waits for a watcher and a slow watcher
costs no memory. A watcher that falls so far behind that its next revision has been
compacted ends with :class:`~gtm.errors.CompactedError` — the same signal as etcd's, and
the one a snapshot watcher already handles: re-list with ``range`` and watch again.

Leases expire on the injected :class:`~gtm.clock.Clock`. Every call first expires the
leases that are due (so reads never see a key whose lease is gone), and the owner runs
:meth:`MemoryStore.expire_due` periodically so that watchers see the DELETE events even
when nobody calls the store — :meth:`MemoryStore.run_expiry` starts that loop on a
:class:`~gtm.tasks.TaskSupervisor`.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm.errors import CompactedError, LeaseNotFound, StateError, StateUnavailable
from gtm.state.store import (
    EventType,
    KeyValue,
    Lease,
    RangeResult,
    TxnResult,
    WatchBatch,
    WatchEvent,
    granted_ttl,
)

if TYPE_CHECKING:
    from gtm.clock import Clock
    from gtm.tasks import TaskSupervisor

#: How often the owner should run :meth:`MemoryStore.expire_due`. etcd's lessor checks
#: for expired leases every 500 ms (server/lease/lessor.go, ``runLoop``), so a watcher
#: sees an expiry at most this late on either store.
LEASE_EXPIRY_INTERVAL = 0.5

#: Revisions of history kept for watchers (older ones are compacted automatically).
#: At ~2 KB per zone summary this bounds history at a few tens of MB.
DEFAULT_HISTORY_LIMIT = 10_000

#: etcd's default ``--max-request-bytes`` (1.5 MiB): larger writes are refused by both
#: stores, so nothing that works on the embedded store fails on etcd for its size.
MAX_REQUEST_BYTES = 1_572_864

#: At most this many events per watch batch when a watcher catches up (one revision's
#: events are never split, so a larger revision makes a larger batch).
WATCH_BATCH_MAX_EVENTS = 1_000

#: The revision of an empty store (etcd starts at 1; the first write is revision 2).
_FIRST_REVISION = 1


def _check_key(key: str) -> str:
    if not key:
        raise ValueError("state-store keys must not be empty")
    return key


@dataclass(slots=True)
class _LeaseState:
    ttl: int
    deadline: float
    keys: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Change:
    """The events of one revision."""

    revision: int
    events: tuple[WatchEvent, ...]


_GAUGE_HELP = {
    "gtm_state_memory_keys": "Keys in the embedded store.",
    "gtm_state_memory_leases": "Live leases in the embedded store.",
    "gtm_state_memory_revision": "Current revision of the embedded store.",
    "gtm_state_memory_watchers": "Open watches on the embedded store.",
}


class _Metrics:
    def __init__(self, registry: CollectorRegistry, gauges: dict[str, Callable[[], float]]) -> None:
        for name, getter in gauges.items():
            Gauge(name, _GAUGE_HELP[name], registry=registry).set_function(getter)
        self.expired_leases = Counter(
            "gtm_state_memory_expired_leases_total",
            "Leases of the embedded store that expired (not revoked).",
            registry=registry,
        )
        self.watchers_compacted = Counter(
            "gtm_state_memory_watchers_compacted_total",
            "Watches ended with CompactedError because their history was compacted.",
            registry=registry,
        )


class MemoryStore:
    """An in-process :class:`~gtm.state.store.StateStore` with etcd's semantics."""

    def __init__(
        self,
        clock: Clock,
        registry: CollectorRegistry | None = None,
        *,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
    ) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self._clock = clock
        self._history_limit = history_limit
        self._kvs: dict[str, KeyValue] = {}
        self._sorted_keys: list[str] = []
        self._revision = _FIRST_REVISION
        self._history: list[_Change] = []  # contiguous revisions, oldest first
        self._oldest = _FIRST_REVISION  # watches may start at this revision or later
        self._leases: dict[int, _LeaseState] = {}
        self._deadlines: list[tuple[float, int]] = []  # heap; stale entries are skipped
        self._lease_ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._watchers = 0
        self._closed = False
        self._metrics = _Metrics(
            registry or CollectorRegistry(auto_describe=True),
            {
                "gtm_state_memory_keys": lambda: len(self._kvs),
                "gtm_state_memory_leases": lambda: len(self._leases),
                "gtm_state_memory_revision": lambda: self._revision,
                "gtm_state_memory_watchers": lambda: self._watchers,
            },
        )

    # ------------------------------------------------------------------ introspection

    @property
    def oldest_revision(self) -> int:
        """The oldest revision a watch may start from (everything older is compacted)."""
        return self._oldest

    # ------------------------------------------------------------------ reads

    async def get(self, key: str) -> KeyValue | None:
        self._enter()
        return self._kvs.get(_check_key(key))

    async def range(self, prefix: str) -> RangeResult:
        self._enter()
        return RangeResult(self._revision, tuple(self._kvs[k] for k in self._keys_under(prefix)))

    async def current_revision(self) -> int:
        self._enter()
        return self._revision

    # ------------------------------------------------------------------ writes

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self._enter()
        self._check_write(_check_key(key), value, lease)
        revision = self._revision + 1
        self._commit(revision, [self._apply_put(key, value, lease, revision)])
        return revision

    async def delete(self, key: str) -> bool:
        self._enter()
        if _check_key(key) not in self._kvs:
            return False
        revision = self._revision + 1
        self._commit(revision, [self._apply_delete(key, revision)])
        return True

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        self._enter()
        if self._mod_revision(_check_key(key)) != expected_mod_revision:
            return TxnResult(False, self._revision)
        # As etcd, the write is checked only on the branch taken: a failed compare with
        # a dead lease is just a failed compare.
        self._check_write(key, value, lease)
        revision = self._revision + 1
        self._commit(revision, [self._apply_put(key, value, lease, revision)])
        return TxnResult(True, revision)

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> TxnResult:
        self._enter()
        if self._mod_revision(_check_key(key)) != expected_mod_revision:
            return TxnResult(False, self._revision)
        if key not in self._kvs:  # expected 0 and absent: nothing to do, no new revision
            return TxnResult(True, self._revision)
        revision = self._revision + 1
        self._commit(revision, [self._apply_delete(key, revision)])
        return TxnResult(True, revision)

    # ------------------------------------------------------------------ leases

    async def grant_lease(self, ttl: float) -> Lease:
        self._enter()
        seconds = granted_ttl(ttl)
        lease_id = next(self._lease_ids)
        deadline = self._clock.monotonic() + seconds
        self._leases[lease_id] = _LeaseState(seconds, deadline)
        heapq.heappush(self._deadlines, (deadline, lease_id))
        return Lease(lease_id, float(seconds))

    async def keep_alive(self, lease_id: int) -> float:
        self._enter()
        state = self._leases.get(lease_id)
        if state is None:
            raise LeaseNotFound(lease_id)
        state.deadline = self._clock.monotonic() + state.ttl
        heapq.heappush(self._deadlines, (state.deadline, lease_id))
        return float(state.ttl)

    async def revoke_lease(self, lease_id: int) -> None:
        self._enter()
        self._drop_lease(lease_id)

    async def expire_due(self) -> None:
        """Expire every lease whose deadline has passed, deleting its keys.

        Runs as a side effect of every call too; the owner runs it every
        :data:`LEASE_EXPIRY_INTERVAL` (see :meth:`run_expiry`) so that an expiry reaches
        watchers even when nobody calls the store.
        """
        if not self._closed:
            self._expire()

    def run_expiry(
        self, supervisor: TaskSupervisor, *, interval: float = LEASE_EXPIRY_INTERVAL
    ) -> asyncio.Task[Any]:
        """Run :meth:`expire_due` every ``interval`` seconds on ``supervisor``'s clock."""
        return supervisor.run_loop("memory-store-lease-expiry", self.expire_due, interval=interval)

    # ------------------------------------------------------------------ history

    async def compact(self, revision: int) -> None:
        self._enter()
        if revision > self._revision:
            raise StateError(
                f"cannot compact to revision {revision}: the store is at {self._revision}"
            )
        self._compact_to(revision)

    def watch(self, prefix: str, *, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        return self._watch(prefix, start_revision)

    async def aclose(self) -> None:
        """End every watch; later calls raise StateUnavailable."""
        self._closed = True
        self._wake_watchers()

    # ------------------------------------------------------------------ internals

    def _enter(self) -> None:
        if self._closed:
            raise StateUnavailable("the embedded state store is closed")
        self._expire()

    def _keys_under(self, prefix: str) -> Iterator[str]:
        keys = self._sorted_keys
        for i in range(bisect.bisect_left(keys, prefix), len(keys)):
            if not keys[i].startswith(prefix):
                return
            yield keys[i]

    def _mod_revision(self, key: str) -> int:
        kv = self._kvs.get(key)
        return 0 if kv is None else kv.mod_revision

    def _check_write(self, key: str, value: bytes, lease: int) -> None:
        size = len(key.encode()) + len(value)
        if size > MAX_REQUEST_BYTES:
            raise StateError(
                f"write to {key!r} is too large ({size} bytes; the limit is "
                f"{MAX_REQUEST_BYTES}, etcd's default --max-request-bytes)"
            )
        if lease and lease not in self._leases:
            raise LeaseNotFound(lease)

    def _apply_put(self, key: str, value: bytes, lease: int, revision: int) -> WatchEvent:
        old = self._kvs.get(key)
        if old is None:
            bisect.insort(self._sorted_keys, key)
            kv = KeyValue(key, value, revision, revision, 1, lease)
        else:
            self._detach(old)
            kv = KeyValue(key, value, old.create_revision, revision, old.version + 1, lease)
        self._kvs[key] = kv
        if lease:
            self._leases[lease].keys.add(key)
        return WatchEvent(EventType.PUT, kv)

    def _apply_delete(self, key: str, revision: int) -> WatchEvent:
        old = self._kvs.pop(key)
        del self._sorted_keys[bisect.bisect_left(self._sorted_keys, key)]
        self._detach(old)
        # As etcd: a DELETE event carries only the key and the revision of the deletion.
        return WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, revision, 0, 0))

    def _detach(self, kv: KeyValue) -> None:
        if kv.lease and (state := self._leases.get(kv.lease)) is not None:
            state.keys.discard(kv.key)

    def _commit(self, revision: int, events: list[WatchEvent]) -> None:
        self._revision = revision
        self._history.append(_Change(revision, tuple(events)))
        # Trim in chunks (a quarter of the limit) so that trimming is amortised O(1).
        if len(self._history) > self._history_limit + self._history_limit // 4:
            self._compact_to(self._history[-self._history_limit].revision)
        self._wake_watchers()

    def _compact_to(self, revision: int) -> None:
        if revision <= self._oldest:
            return
        if self._history:
            drop = max(0, min(len(self._history), revision - self._history[0].revision))
            del self._history[:drop]
        self._oldest = revision

    def _wake_watchers(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _expire(self) -> None:
        now = self._clock.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._deadlines)
            state = self._leases.get(lease_id)
            if state is not None and state.deadline == deadline:  # else refreshed or gone
                self._metrics.expired_leases.inc()
                self._drop_lease(lease_id)

    def _drop_lease(self, lease_id: int) -> None:
        state = self._leases.pop(lease_id, None)
        if state is None or not state.keys:
            return  # as etcd: revoking a lease without keys makes no revision
        revision = self._revision + 1
        # One revision for all the lease's keys, deleted in key order (as etcd's lessor).
        self._commit(revision, [self._apply_delete(key, revision) for key in sorted(state.keys)])

    async def _watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        self._enter()
        cursor = start_revision if start_revision > 0 else self._revision + 1
        self._watchers += 1
        try:
            while not self._closed:
                self._expire()
                if cursor < self._oldest:
                    self._metrics.watchers_compacted.inc()
                    raise CompactedError(cursor, self._oldest)
                scanned, events = self._collect(prefix, cursor)
                cursor = max(cursor, scanned + 1)
                if events:
                    yield WatchBatch(events[-1].kv.mod_revision, events)
                    continue
                await self._changed.wait()
        finally:
            self._watchers -= 1

    def _collect(self, prefix: str, cursor: int) -> tuple[int, tuple[WatchEvent, ...]]:
        """Events under ``prefix`` from revision ``cursor`` on, and the last revision
        scanned (a batch ends at a revision boundary)."""
        if not self._history or cursor > self._revision:
            return cursor - 1, ()
        events: list[WatchEvent] = []
        scanned = cursor - 1
        for i in range(max(0, cursor - self._history[0].revision), len(self._history)):
            change = self._history[i]
            matched = [e for e in change.events if e.kv.key.startswith(prefix)]
            if events and len(events) + len(matched) > WATCH_BATCH_MAX_EVENTS:
                break
            events.extend(matched)
            scanned = change.revision
        return scanned, tuple(events)

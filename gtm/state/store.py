"""The state-store seam: a small protocol that both :class:`~gtm.state.memory.MemoryStore`
(the embedded default) and :class:`~gtm.state.etcd.EtcdStore` implement, verified by
one contract-test suite (``tests/contract/test_state_store.py``).

The semantics are etcd v3's, narrowed to what gtm needs:

* every write bumps a store-wide ``revision``; each key carries ``create_revision``,
  ``mod_revision`` and ``version`` (writes since creation);
* ``compare_and_swap`` on ``mod_revision`` is the only way to take ownership of a key
  (revisions are fencing tokens); ``expected_mod_revision=0`` means "must not exist";
* leases have a TTL in seconds; keys attached to a lease are deleted when it expires
  or is revoked, and watchers see those deletions;
* ``watch(prefix, start_revision)`` yields every change with ``mod_revision >=
  start_revision`` in order, then live changes; asking for compacted history raises
  :class:`~gtm.errors.CompactedError` — re-list with ``range`` and watch again.

Keys are ``str`` (built only by :mod:`gtm.state.keys`), values are ``bytes``
(encoded only by :mod:`gtm.state.codec`). All errors are from :mod:`gtm.errors`.

Details both implementations share (pinned by the contract suite):

* an empty store is at revision 1 (as etcd); ``range``/``watch`` prefixes are plain
  string prefixes (``"/a/b"`` matches ``"/a/bc"``; end a prefix with ``/`` to mean a
  directory); keys are ordered by their UTF-8 bytes;
* lease TTLs are whole seconds — :func:`granted_ttl` rounds a request up (etcd's lease
  API is integer seconds), so code tested on the memory store behaves the same on etcd;
* ``watch`` returns an async *generator*: call ``aclose()`` (or use
  ``contextlib.aclosing``) to release the underlying stream promptly. ``start_revision``
  of 0 means "changes after now" (from the first iteration). A batch's ``revision`` is
  its last event's, a safe resume point: ``watch(prefix, start_revision=batch.revision
  + 1)`` misses nothing; one revision's events are never split across batches. After ``aclose()``
  of the store, watches end (``StopAsyncIteration``) and other calls raise
  :class:`~gtm.errors.StateUnavailable`.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0  # 0: no lease


class EventType(StrEnum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. For DELETE, ``kv.value`` is empty and ``kv.mod_revision`` is the
    revision of the deletion."""

    type: EventType
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """Events delivered together, in revision order; ``revision`` is the revision they
    bring us to (that of the last event): resume a watch from ``revision + 1``."""

    revision: int
    events: tuple[WatchEvent, ...]


@dataclass(frozen=True, slots=True)
class RangeResult:
    """Keys under a prefix at one consistent ``revision`` (sorted by key)."""

    revision: int
    kvs: tuple[KeyValue, ...]


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of a compare-and-swap: ``succeeded`` and the store revision after it."""

    succeeded: bool
    revision: int


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: float  # seconds granted


def granted_ttl(ttl: float) -> int:
    """The TTL a lease request for ``ttl`` seconds gets: rounded up to whole seconds, at
    least 1 (etcd's ``LeaseGrant`` takes integer seconds). Raises ValueError unless
    ``ttl`` is a positive finite number."""
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"lease TTL must be a positive number of seconds, got {ttl!r}")
    return max(1, math.ceil(ttl))


class StateStore(Protocol):
    """Async key-value store with revisions, CAS, leases and watches."""

    async def get(self, key: str) -> KeyValue | None: ...

    async def range(self, prefix: str) -> RangeResult: ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``value``; return the new store revision."""
        ...

    async def delete(self, key: str) -> bool:
        """Delete ``key``; ``True`` if it existed."""
        ...

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        """Write only if the key's ``mod_revision`` equals ``expected_mod_revision``
        (0: only if absent)."""
        ...

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> TxnResult: ...

    async def grant_lease(self, ttl: float) -> Lease:
        """A new lease of :func:`granted_ttl` seconds (``Lease.ttl`` is what was granted)."""
        ...

    async def keep_alive(self, lease_id: int) -> float:
        """Refresh a lease; return its TTL. Raises LeaseNotFound if it is gone."""
        ...

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease and delete its keys (no error if already gone)."""
        ...

    async def current_revision(self) -> int: ...

    async def compact(self, revision: int) -> None:
        """Drop history before ``revision`` (watches from before it raise CompactedError)."""
        ...

    def watch(self, prefix: str, *, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        """Changes under ``prefix`` from ``start_revision`` (inclusive), then live.

        Raises (when iterated) CompactedError if ``start_revision`` — or, for a watcher
        that fell too far behind, its next revision — is compacted, and
        StateUnavailable if the store connection is lost; resume with a new watch from
        the last batch's ``revision + 1``."""
        ...

    async def aclose(self) -> None: ...

"""Immutable fleet snapshots, kept current from the state store.

Routing reads a :class:`FleetSnapshot`; it never reads the store. A
:class:`SnapshotWatcher` lists ``/gtm/v1/`` once, then follows a watch from the listed
revision, and after each batch of changes publishes a new snapshot by a single reference
assignment — readers never see a half-applied batch and never take a lock.

Static stability (ARCHITECTURE §4; the AWS Builders' Library, "Static stability using
Availability Zones"): when the store is unreachable, the last snapshot stays in force and
is marked stale; the watcher reconnects with exponential backoff and resumes from the
last revision it saw, so nothing is re-read. Only when that revision has been compacted
away does it re-list — the re-listed snapshot replaces the old one in one step, so keys
deleted while we were away disappear too.

Values that fail to decode are skipped and counted (``gtm_snapshot_invalid_records``);
one bad record must not hide the rest of the fleet.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Final, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm.clock import Clock
from gtm.errors import CodecError, CompactedError, StateUnavailable
from gtm.models import (
    Drain,
    DrainTarget,
    GpuWorker,
    Region,
    RegionSummary,
    StoredRecord,
    Tenant,
    Zone,
    ZoneSummary,
)
from gtm.outage import OutageLog
from gtm.state import codec, keys
from gtm.state.store import EventType, KeyValue, StateStore, WatchBatch, WatchEvent
from gtm.tasks import Backoff

log = logging.getLogger(__name__)


#: Record type stored under each kind of key the fleet snapshot follows. Policies and
#: quota leases have their own watchers and are ignored here.
_RECORD_TYPES: Final[Mapping[keys.Kind, type[StoredRecord]]] = MappingProxyType(
    {
        keys.Kind.REGION: Region,
        keys.Kind.ZONE: Zone,
        keys.Kind.GPU: GpuWorker,
        keys.Kind.ZONE_SUMMARY: ZoneSummary,
        keys.Kind.REGION_SUMMARY: RegionSummary,
        keys.Kind.TENANT: Tenant,
        keys.Kind.DRAIN: Drain,
    }
)


@dataclass(frozen=True)
class FleetSnapshot:
    """What the fleet looked like at store ``revision``. Immutable; share freely.

    Maps are keyed by record id (drains by ``"{target}/{id}"``).
    """

    revision: int
    regions: Mapping[str, Region] = field(default_factory=lambda: MappingProxyType({}))
    zones: Mapping[str, Zone] = field(default_factory=lambda: MappingProxyType({}))
    gpus: Mapping[str, GpuWorker] = field(default_factory=lambda: MappingProxyType({}))
    zone_summaries: Mapping[str, ZoneSummary] = field(default_factory=lambda: MappingProxyType({}))
    region_summaries: Mapping[str, RegionSummary] = field(
        default_factory=lambda: MappingProxyType({})
    )
    tenants: Mapping[str, Tenant] = field(default_factory=lambda: MappingProxyType({}))
    drains: Mapping[str, Drain] = field(default_factory=lambda: MappingProxyType({}))

    @cached_property
    def zones_by_region(self) -> Mapping[str, tuple[Zone, ...]]:
        return _group(self.zones.values(), lambda z: z.region_id)

    @cached_property
    def gpus_by_zone(self) -> Mapping[str, tuple[GpuWorker, ...]]:
        return _group(self.gpus.values(), lambda g: g.zone_id)

    def is_drained(self, target: DrainTarget, target_id: str) -> bool:
        return f"{target.value}/{target_id}" in self.drains


_T = TypeVar("_T")


def _group(items: Iterable[_T], key: Callable[[_T], str]) -> Mapping[str, tuple[_T, ...]]:
    groups: dict[str, list[_T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return MappingProxyType({k: tuple(sorted(v, key=repr)) for k, v in sorted(groups.items())})


# ---------------------------------------------------------------------------- building


def _record_id(kind: keys.Kind, parts: tuple[str, ...]) -> str:
    if kind is keys.Kind.DRAIN:
        return f"{parts[0]}/{parts[1]}"
    return parts[-1]


def _identity_matches(record: StoredRecord, kind: keys.Kind, parts: tuple[str, ...]) -> bool:
    """The ids inside a record must agree with its key: a GPU record copied under another
    zone's key would otherwise be routed to as if it lived there."""
    match record:
        case Region(id=rid) | Tenant(id=rid) | RegionSummary(region_id=rid):
            return (rid,) == parts
        case Zone(id=zid, region_id=rid) | ZoneSummary(zone_id=zid, region_id=rid):
            return (rid, zid) == parts
        case GpuWorker(id=gid, zone_id=zid, region_id=rid):
            return (rid, zid, gid) == parts
        case Drain(target=target, id=did):
            return (target.value, did) == parts
    return False


_FIELD_BY_KIND: Final[Mapping[keys.Kind, str]] = MappingProxyType(
    {
        keys.Kind.REGION: "regions",
        keys.Kind.ZONE: "zones",
        keys.Kind.GPU: "gpus",
        keys.Kind.ZONE_SUMMARY: "zone_summaries",
        keys.Kind.REGION_SUMMARY: "region_summaries",
        keys.Kind.TENANT: "tenants",
        keys.Kind.DRAIN: "drains",
    }
)


class _Working:
    """The watcher's private, mutable view, one dict per kind; frozen into snapshots."""

    def __init__(self) -> None:
        self.tables: dict[keys.Kind, dict[str, StoredRecord]] = {k: {} for k in _RECORD_TYPES}
        self.invalid: set[str] = set()

    def apply(self, event_type: EventType, kv: KeyValue) -> keys.Kind | None:
        """Apply one change; return the kind it touched (None if not a fleet key)."""
        parsed = keys.parse(kv.key)
        if parsed is None or parsed.kind not in _RECORD_TYPES:
            return None
        table = self.tables[parsed.kind]
        record_id = _record_id(parsed.kind, parsed.parts)
        self.invalid.discard(kv.key)
        if event_type is EventType.DELETE:
            table.pop(record_id, None)
            return parsed.kind
        try:
            record = codec.decode(kv.key, kv.value, _RECORD_TYPES[parsed.kind])
            if not _identity_matches(record, parsed.kind, parsed.parts):
                raise CodecError(kv.key, "ids in the record do not match its key")
        except CodecError as exc:
            log.warning("skipping invalid record: %s", exc)
            self.invalid.add(kv.key)
            table.pop(record_id, None)
            return parsed.kind
        table[record_id] = record
        return parsed.kind

    def freeze(
        self, revision: int, previous: FleetSnapshot | None, touched: set[keys.Kind]
    ) -> FleetSnapshot:
        """A new snapshot; maps of kinds no change touched are shared with ``previous``."""
        fields: dict[str, Mapping[str, StoredRecord]] = {}
        for kind, name in _FIELD_BY_KIND.items():
            if previous is not None and kind not in touched:
                fields[name] = getattr(previous, name)
            else:
                fields[name] = MappingProxyType(dict(sorted(self.tables[kind].items())))
        return FleetSnapshot(revision, **fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- watcher


@dataclass(frozen=True, slots=True)
class _ProbeOk:
    revision: int


class SnapshotWatcher:
    """Keeps :attr:`current` in step with the store; run :meth:`run` as a supervised task.

    Metrics (on the injected registry):

    * ``gtm_snapshot_revision`` — store revision of the current snapshot;
    * ``gtm_snapshot_stale`` — 1 while the store is unreachable (serving the last snapshot);
    * ``gtm_snapshot_staleness_seconds`` — seconds since the watcher was last known in sync;
    * ``gtm_snapshot_reconnects_total``, ``gtm_snapshot_relists_total``;
    * ``gtm_snapshot_invalid_records`` — stored values skipped because they do not decode.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        clock: Clock,
        registry: CollectorRegistry,
        component: str = "gtm",
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        probe_interval: float = 1.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._backoff = backoff or Backoff(initial=0.1, maximum=5.0)
        self._rng = rng or random.Random()
        self._probe_interval = probe_interval
        self._snapshot = FleetSnapshot(revision=0)
        self._working = _Working()
        self._stale = True
        self._last_sync = clock.monotonic()
        self._changed = asyncio.Condition()
        self._ready = asyncio.Event()

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["component"], registry=registry).labels(component)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["component"], registry=registry).labels(component)

        self._m_revision = gauge("gtm_snapshot_revision", "Store revision of the current snapshot.")
        self._m_stale = gauge(
            "gtm_snapshot_stale",
            "1 while the store is unreachable and the last snapshot is served.",
        )
        gauge(
            "gtm_snapshot_staleness_seconds", "Seconds since the snapshot was last known in sync."
        ).set_function(self.staleness_seconds)
        self._m_reconnects = counter(
            "gtm_snapshot_reconnects_total", "Watch reconnects after the store was unreachable."
        )
        self._m_relists = counter(
            "gtm_snapshot_relists_total", "Full re-lists (start-up or after compaction)."
        )
        gauge(
            "gtm_snapshot_invalid_records", "Stored values skipped because they do not decode."
        ).set_function(lambda: len(self._working.invalid))
        self._m_stale.set(1)
        #: One fault of the store, logged when it starts and ends (its attempts are
        #: counted in gtm_snapshot_reconnects_total).
        self._outage = OutageLog("snapshot watch", logger=log, clock=clock)

    # -- reading ------------------------------------------------------------------

    @property
    def current(self) -> FleetSnapshot:
        """The latest snapshot (an empty one at revision 0 before the first list)."""
        return self._snapshot

    @property
    def stale(self) -> bool:
        return self._stale

    @property
    def invalid_keys(self) -> frozenset[str]:
        return frozenset(self._working.invalid)

    def staleness_seconds(self) -> float:
        return 0.0 if not self._stale else max(0.0, self._clock.monotonic() - self._last_sync)

    async def wait_ready(self) -> FleetSnapshot:
        """Wait for the first complete listing."""
        await self._ready.wait()
        return self._snapshot

    async def wait_for_revision(self, revision: int) -> FleetSnapshot:
        """Wait until the snapshot reflects at least ``revision``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._snapshot.revision >= revision)
        return self._snapshot

    async def wait_stale(self, stale: bool = True) -> None:
        """Wait until the watcher is (or is no longer) stale."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._stale is stale)

    # -- running ------------------------------------------------------------------

    async def run(self) -> None:
        """List, then follow the watch forever; reconnect with backoff, re-list on compaction.

        Never returns; cancel it to stop. Run it under a :class:`~gtm.tasks.TaskSupervisor`.
        """
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                await self._follow()
            except CompactedError as exc:
                log.warning("snapshot watch fell behind compaction (%s); re-listing", exc)
                need_list = True
            except Exception as exc:  # a bug must not end the watcher either: back off, retry
                await self._retry_later(exc)

    async def _retry_later(self, exc: Exception) -> None:
        """One failed attempt: logged when the fault starts (:class:`OutageLog`), the
        snapshot served as stale, a backoff that grows with the fault's attempts."""
        revision = self._snapshot.revision
        self._outage.consequence = f"serving snapshot at revision {revision} as stale"
        self._outage.failed(exc)
        await self._mark_stale()
        delay = self._backoff.delay(self._outage.attempts - 1, self._rng)
        await self._clock.sleep(delay)
        self._m_reconnects.inc()

    async def _relist(self) -> None:
        listing = await self._store.range(keys.ROOT)
        working = _Working()
        for kv in listing.kvs:
            working.apply(EventType.PUT, kv)
        self._working = working
        self._m_relists.inc()
        await self._publish(working.freeze(listing.revision, None, set()))

    async def _follow(self) -> None:
        """Follow the watch until it fails; a prober beside it notices a silent outage.

        A gRPC watch stream can sit idle for a long time, and an idle stream does not
        tell us the server died; so a probe of the store's revision every
        ``probe_interval`` seconds runs next to it. Both feed one queue, so this
        coroutine has a single wait point and needs no timeouts.
        """
        queue: asyncio.Queue[WatchBatch | _ProbeOk | BaseException] = asyncio.Queue()
        start = self._snapshot.revision + 1
        async with asyncio.TaskGroup() as group:
            pump = group.create_task(self._pump(start, queue), name="snapshot-watch")
            probe = group.create_task(self._probe(queue), name="snapshot-probe")
            failure = await self._consume(queue)
            pump.cancel()
            probe.cancel()
        raise failure

    async def _pump(
        self, start: int, queue: asyncio.Queue[WatchBatch | _ProbeOk | BaseException]
    ) -> None:
        try:
            async for batch in self._store.watch(keys.ROOT, start_revision=start):
                queue.put_nowait(batch)
            queue.put_nowait(StateUnavailable("watch ended"))
        except Exception as exc:
            queue.put_nowait(exc)

    async def _probe(self, queue: asyncio.Queue[WatchBatch | _ProbeOk | BaseException]) -> None:
        while True:
            await self._clock.sleep(self._probe_interval)
            try:
                queue.put_nowait(_ProbeOk(await self._store.current_revision()))
            except Exception as exc:
                queue.put_nowait(exc)
                return

    async def _consume(
        self, queue: asyncio.Queue[WatchBatch | _ProbeOk | BaseException]
    ) -> BaseException:
        """Apply batches until the queue yields a failure; return that failure."""
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                return item
            if isinstance(item, _ProbeOk):
                if self._stale:
                    # Connected again and the watch is live: what we hold is current up
                    # to events already in flight.
                    await self._publish(self._snapshot)
                else:
                    self._last_sync = self._clock.monotonic()
                continue
            touched = self._apply_events(item.events)
            revision = max(item.revision, self._snapshot.revision)
            if touched or revision != self._snapshot.revision or self._stale:
                await self._publish(self._working.freeze(revision, self._snapshot, touched))

    def _apply_events(self, events: tuple[WatchEvent, ...]) -> set[keys.Kind]:
        touched: set[keys.Kind] = set()
        for event in events:
            kind = self._working.apply(event.type, event.kv)
            if kind is not None:
                touched.add(kind)
        return touched

    async def _publish(self, snapshot: FleetSnapshot) -> None:
        self._snapshot = snapshot  # the one atomic swap readers rely on
        self._last_sync = self._clock.monotonic()
        self._m_revision.set(snapshot.revision)
        async with self._changed:
            if self._outage.recovered() is None and self._stale:
                log.info("snapshot in sync at revision %d", snapshot.revision)
            self._stale = False
            self._m_stale.set(0)
            self._changed.notify_all()
        self._ready.set()

    async def _mark_stale(self) -> None:
        async with self._changed:
            self._stale = True
            self._m_stale.set(1)
            self._changed.notify_all()

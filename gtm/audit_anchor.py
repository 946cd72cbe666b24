"""Audit anchoring: each audit chain's head, recorded in the state store.

A hash chain proves that the records it holds are the ones written, in order, but not
that it still holds all of them: cut the newest file's tail and delete (or rewrite) its
``.head`` file, and what is left is a valid, shorter chain. So every tier that writes an
audit chain (:class:`policies.audit.AuditWriter`) also runs an :class:`AuditAnchorer`,
which records where the chain ends — an :class:`policies.audit.Anchor`: directory,
prefix, the file holding the last record, its seq and hash, the time — under
``/gtm/v1/audit-anchors/<chain id>`` (:func:`chain_id`: the prefix and a digest of the
host and directory, one key per writer), and ``gtm audit verify --state URL`` checks the
files against it: a chain that ends below its anchor has lost its tail, whatever its
``.head`` says. The key's revision says when the store took it.

**When.** At every rotation (the position of the file the writer leaves, its exact
end), and at most every ``interval`` seconds while the chain grows (its head). A chain
that does not grow is not rewritten (nothing new to protect, no revision churn). The
interval bounds what a cut can take unseen: records younger than the last anchor. The
default, :data:`DEFAULT_INTERVAL_S`, is one etcd write per writer every 15 s at most —
next to the summaries each tier publishes every second, nothing — and the window is
shorter than an operator's reaction to an alert on ``gtm_audit_anchor_age_seconds``.

**Static stability.** Anchoring is a supervised background task: appending a record
never waits for the store. While the store is away the anchorer retries with backoff,
logs the outage once when it starts and once when it ends (:class:`gtm.outage.OutageLog`),
counts the failed attempts and shows the growing age and count of unanchored records;
when the store is back it anchors the current head (and the last rotation it missed).

**A writer restarted below its anchor** (the chain's tail was cut, or its files
replaced, while it was down) is found at start-up: the stored anchor records a record
the chain no longer holds (a chain that grew past the anchor again is checked for the
anchored record's hash, in the one file that holds it). The anchorer logs an error
and records the cut in every later anchor of the chain
(:class:`policies.audit.PriorAnchor`), so a restart does not launder it; ``gtm audit
verify`` reports it.

**What it does not protect against**: whoever can write the store as well as the log's
directory (SECURITY.md). It raises the bar from "can write the files" to "can write
the files and the store".
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import socket
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm.clock import Clock
from gtm.errors import StateError
from gtm.outage import OutageLog
from gtm.state import keys
from gtm.state.store import StateStore
from gtm.tasks import Backoff
from policies.audit import (
    Anchor,
    AuditWriter,
    ChainPosition,
    PriorAnchor,
    StoredAnchor,
    record_hash,
)

log = logging.getLogger(__name__)

#: At most this long between a record and its anchor (while the chain grows), seconds.
DEFAULT_INTERVAL_S = 15.0
#: How often the anchorer looks for a rotation or a due anchor, seconds: a rotation is
#: anchored within this.
POLL_S = 1.0
#: The most a stopping tier waits for its last anchor, seconds.
CLOSE_TIMEOUT_S = 2.0

ANCHOR_PREFIX = keys.prefix(keys.Kind.AUDIT_ANCHOR)


def chain_id(host: str, directory: Path, prefix: str) -> str:
    """The key segment of one writer's chain: its prefix, and a digest of where it is
    (a writer locks its directory, so host and directory name one writer)."""
    digest = hashlib.sha256(f"{host}\0{directory}".encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


class AuditAnchorer:
    """Anchors one writer's chain in ``store``: :meth:`run` as a supervised task, then
    :meth:`close` for a last anchor. Creates its metrics on ``registry`` (one anchorer
    per registry)."""

    def __init__(
        self,
        writer: AuditWriter,
        store: StateStore,
        *,
        clock: Clock,
        registry: CollectorRegistry,
        interval: float = DEFAULT_INTERVAL_S,
        poll: float = POLL_S,
        host: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if interval <= 0 or poll <= 0:
            raise ValueError("interval and poll must be positive")
        self._writer = writer
        self._store = store
        self._clock = clock
        self._interval = interval
        self._poll = min(poll, interval)
        self._host = host if host is not None else socket.gethostname()
        self._directory = writer.directory.resolve()
        self.key = keys.audit_anchor(chain_id(self._host, self._directory, writer.prefix))
        self._rng = rng or random.Random()
        self._backoff = Backoff(initial=self._poll, maximum=max(self._poll, 5.0))
        self._rotated: ChainPosition | None = None
        self._anchored: ChainPosition | None = None  # what the store holds, as far as known
        self._stored: StoredAnchor | None = None
        self._last_write = clock.monotonic() - interval  # the first anchor is due at once
        self._anchored_at = clock.monotonic()  # when the store last held the current head
        self._checked = False
        self._start = writer.position()  # where the chain ended when the writer opened it
        self._cut: PriorAnchor | None = None
        label = writer.prefix
        self._age = Gauge(
            "gtm_audit_anchor_age_seconds",
            "Seconds the audit chain's newest records have waited for an anchor in the "
            "state store (0 when every record is anchored).",
            ["chain"],
            registry=registry,
        ).labels(label)
        self._unanchored = Gauge(
            "gtm_audit_unanchored_records",
            "Audit records written since the chain's last anchor in the state store.",
            ["chain"],
            registry=registry,
        ).labels(label)
        self._last = Gauge(
            "gtm_audit_anchor_timestamp_seconds",
            "Wall-clock time the audit chain was last anchored in the state store.",
            ["chain"],
            registry=registry,
        ).labels(label)
        self._failures = Counter(
            "gtm_audit_anchor_failures_total",
            "Failed attempts to anchor the audit chain in the state store.",
            ["chain"],
            registry=registry,
        ).labels(label)
        self._outage = OutageLog(
            f"audit anchoring of {self._directory} ({writer.prefix} chain)",
            logger=log,
            clock=clock,
            count=self._failures.inc,
            consequence="requests are served and audited; the chain is anchored when the "
            "store is back",
        )
        writer.set_rotation_hook(self._on_rotate)

    @property
    def anchored(self) -> StoredAnchor | None:
        """The anchor the store holds for this chain, as far as this anchorer knows
        (None before its first)."""
        return self._stored

    def _on_rotate(self, position: ChainPosition) -> None:
        # Called by the writer under its lock: only note it.
        self._rotated = position

    async def run(self) -> None:
        """Anchor until cancelled; never raises (a failure is retried with backoff)."""
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._outage.failed(exc)
                self._update_gauges()
                await self._clock.sleep(self._backoff.delay(self._outage.attempts - 1, self._rng))
                continue
            self._outage.recovered()
            await self._clock.sleep(self._poll)

    async def step(self) -> bool:
        """One pass: anchor a rotation not yet anchored, and the head when the interval
        has passed and it moved. True if it wrote. Raises what the store raises."""
        if not self._checked:
            await self._check_stored()
        rotated, self._rotated = self._rotated, None
        position = self._writer.position()
        due = self._clock.monotonic() - self._last_write >= self._interval or self._cut_pending
        if position is not None and position != self._anchored and due:
            target: ChainPosition | None = position  # covers a rotation before it
        elif rotated is not None and (self._anchored is None or rotated.seq > self._anchored.seq):
            target = rotated
        else:
            target = None
        if target is not None:
            try:
                await self._write(target)
            except BaseException:
                if rotated is not None and self._rotated is None:
                    self._rotated = rotated  # still to anchor
                raise
        self._update_gauges()
        return target is not None

    @property
    def _cut_pending(self) -> bool:
        return self._cut is not None and (self._stored is None or self._stored.anchor.cut is None)

    async def close(self, within: float = CLOSE_TIMEOUT_S) -> None:
        """A last anchor of the head (stopping tiers); gives up after ``within`` s or
        on a store error, which it logs: stopping never waits on the store for long."""
        self._writer.set_rotation_hook(None)
        try:
            async with asyncio.timeout(within):
                if not self._checked:
                    await self._check_stored()
                position = self._writer.position()
                if position is not None and position != self._anchored:
                    await self._write(position)
        except (StateError, TimeoutError, ConnectionError) as exc:
            log.warning(
                "audit anchoring of %s: no last anchor on shutdown (%s); the chain is "
                "anchored up to seq %s",
                self._directory,
                exc or type(exc).__name__,
                self._anchored.seq if self._anchored is not None else 0,
            )

    async def _check_stored(self) -> None:
        """Compare the stored anchor with the chain the writer continues."""
        kv = await self._store.get(self.key)
        self._checked = True
        if kv is None:
            return
        try:
            stored = Anchor.decode(kv.value)
        except ValueError as exc:
            log.error("audit anchor %s is not readable (%s); replacing it", self.key, exc)
            return
        start = self._start
        found = start.seq if start is not None else 0
        self._cut = stored.cut
        if start is None or start.seq < stored.seq:
            reaches = False
        elif start.seq == stored.seq:
            reaches = start.hash == stored.hash
        else:  # a chain cut and then grown past its anchor again must not launder the cut
            held = await asyncio.to_thread(
                record_hash, self._writer.directory, self._writer.prefix, stored.seq
            )
            reaches = held == stored.hash
        if not reaches:
            self._cut = PriorAnchor(stored.seq, stored.hash, kv.mod_revision, found)
            log.error(
                "audit chain %s (%s) ended at seq %d when its writer started, without the "
                "record its anchor at revision %d holds (seq %d): the chain was cut or "
                "replaced while its writer was down; the cut is recorded in its next anchors",
                self._directory,
                self._writer.prefix,
                found,
                kv.mod_revision,
                stored.seq,
            )
            return
        position = self._writer.position()
        if position is not None and stored.position == position and stored.cut == self._cut:
            self._anchored = position
            self._stored = StoredAnchor(stored, kv.mod_revision, self.key)
            self._last.set(stored.time)

    async def _write(self, position: ChainPosition) -> None:
        anchor = Anchor(
            directory=str(self._directory),
            prefix=self._writer.prefix,
            file=position.file,
            seq=position.seq,
            hash=position.hash,
            time=self._clock.wall(),
            host=self._host,
            cut=self._cut,
        )
        revision = await self._store.put(self.key, anchor.encode())
        self._stored = StoredAnchor(anchor, revision, self.key)
        self._anchored = position
        self._last_write = self._anchored_at = self._clock.monotonic()
        self._last.set(anchor.time)

    def _update_gauges(self) -> None:
        position = self._writer.position()
        anchored = self._anchored.seq if self._anchored is not None else 0
        behind = (position.seq if position is not None else 0) - anchored
        self._unanchored.set(max(0, behind))
        if behind <= 0:
            self._anchored_at = self._clock.monotonic()
        self._age.set(self._clock.monotonic() - self._anchored_at)


async def read_anchors(store: StateStore) -> list[StoredAnchor]:
    """Every audit anchor in ``store``; one that does not decode is logged and left out."""
    listing = await store.range(ANCHOR_PREFIX)
    anchors: list[StoredAnchor] = []
    for kv in listing.kvs:
        try:
            anchors.append(StoredAnchor(Anchor.decode(kv.value), kv.mod_revision, kv.key))
        except ValueError as exc:
            log.warning("skipping %s: %s", kv.key, exc)
    return anchors


__all__ = [
    "ANCHOR_PREFIX",
    "DEFAULT_INTERVAL_S",
    "AuditAnchorer",
    "chain_id",
    "read_anchors",
]

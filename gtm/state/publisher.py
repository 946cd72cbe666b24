"""One record kept in the store under a lease of its own: the one way a component announces itself.

A zone agent's summary, a regional LB's summary and a GPU worker's registration all follow
the same protocol, written here once:

* every round, the lease is kept alive; when it is found gone (it expired while the store
  was out of reach), a new one is granted, and the record is written again under it;
* the record is written under the lease, so when the writer dies it disappears by itself
  once the lease expires (three rounds, as the callers choose their TTL);
* on a clean stop the lease is revoked, so the record disappears at once. Withdrawing
  never raises and is bounded in time: an unreachable store cannot hold up a shutdown.

Store errors other than a lost lease propagate; the caller's supervised loop logs them
and retries with backoff (static stability: a store that is down never stops the writer
from serving).
"""

from __future__ import annotations

import asyncio
import logging

from gtm.errors import LeaseNotFound, StateError
from gtm.models import StoredRecord
from gtm.state.codec import encode
from gtm.state.store import StateStore

log = logging.getLogger(__name__)

#: Bound on the revoke at shutdown, s, so an unreachable store cannot block exit.
REVOKE_TIMEOUT_S = 2.0


class LeasedPublisher:
    """Keeps the record at ``key`` in ``store`` under a lease of ``ttl_s`` seconds.

    ``what`` names the record in log lines ("zone summary", "registration").
    """

    def __init__(self, store: StateStore, key: str, *, ttl_s: float, what: str) -> None:
        self._store = store
        self._ttl = ttl_s
        self._what = what
        self.key = key
        self._lease = 0
        self._written: StoredRecord | None = None
        #: Records written so far.
        self.published = 0

    @property
    def lease_id(self) -> int:
        """The lease the record lives under (0: none yet, or withdrawn)."""
        return self._lease

    @property
    def written(self) -> StoredRecord | None:
        """The record in the store under the current lease (None: none is)."""
        return self._written

    async def publish(self, record: StoredRecord, *, only_changes: bool = False) -> None:
        """Keep the lease alive (or grant a new one) and write ``record`` under it.

        With ``only_changes``, the write is skipped when ``record`` equals the one already
        under the live lease (a lease granted anew always gets the record written)."""
        await self._renew()
        if only_changes and record == self._written:
            return
        await self._store.put(self.key, encode(record), lease=self._lease)
        self._written = record
        self.published += 1

    async def _renew(self) -> None:
        if self._lease:
            try:
                await self._store.keep_alive(self._lease)
            except LeaseNotFound:
                log.warning("%s lease %#x expired; granting a new one", self._what, self._lease)
                self._lease = 0
                self._written = None
        if not self._lease:
            self._lease = (await self._store.grant_lease(self._ttl)).id

    async def withdraw(self, *, timeout_s: float = REVOKE_TIMEOUT_S) -> None:
        """Revoke the lease (the record goes with it). Never raises."""
        lease, self._lease = self._lease, 0
        self._written = None
        if not lease:
            return
        try:
            await asyncio.wait_for(self._store.revoke_lease(lease), timeout_s)
        except (StateError, TimeoutError):
            log.warning("could not revoke the %s lease %#x; it will expire", self._what, lease)

"""Registration of a worker in the state store, under a lease.

The worker's :class:`~gtm.models.GpuWorker` record lives at
``gtm.state.keys.gpu(region, zone, id)``, attached to a lease that a supervised loop
keeps alive. If the worker dies, the lease expires and the record disappears by itself;
on a clean shutdown the lease is revoked so it disappears at once.

Static stability: a store that is down at start-up or later never stops the worker
from serving. The loop keeps retrying (with the supervisor's backoff); when a lease is
found gone (it expired during an outage) the record is written again under a new one.
The record is also rewritten whenever it changes (e.g. ``starting`` → ``ready`` once a
cold start ends).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gtm.errors import LeaseNotFound, StateError
from gtm.models import GpuWorker
from gtm.state import keys
from gtm.state.codec import encode
from gtm.state.store import StateStore
from gtm.tasks import TaskSupervisor

log = logging.getLogger(__name__)

#: Lease TTL (s): a dead worker leaves the fleet view within this time. etcd's own
#: clients default to similar values (etcd's `concurrency` sessions use 60 s; routers
#: need faster, llm-d treats 200 ms-old metrics as stale, so 10 s is a compromise
#: between fast removal and keep-alive traffic).
DEFAULT_LEASE_TTL_S = 10.0

#: Bound on the revoke at shutdown, so an unreachable store cannot block exit.
REVOKE_TIMEOUT_S = 2.0


class WorkerRegistration:
    """Keeps one worker's record in the store while the worker runs."""

    def __init__(
        self,
        store: StateStore,
        record: Callable[[], GpuWorker],
        *,
        supervisor: TaskSupervisor,
        ttl: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self._store = store
        self._record = record
        self._supervisor = supervisor
        self._ttl = ttl
        first = record()
        self.key = keys.gpu(first.region_id, first.zone_id, first.id)
        self._lease = 0
        self._written: GpuWorker | None = None
        self._stopped = False
        self.registered = asyncio.Event()

    @property
    def lease_id(self) -> int:
        return self._lease

    def start(self) -> None:
        """Register and keep alive in the background (a keep-alive every TTL / 3)."""
        self._supervisor.run_loop("registration", self._step, interval=self._ttl / 3)

    async def _step(self) -> None:
        if self._stopped:
            return
        if self._lease:
            try:
                await self._store.keep_alive(self._lease)
            except LeaseNotFound:
                log.warning("registration lease %#x is gone; registering again", self._lease)
                self._lease = 0
                self._written = None
                self.registered.clear()
        if not self._lease:
            lease = await self._store.grant_lease(self._ttl)
            self._lease = lease.id
        record = self._record()
        if record != self._written:
            await self._store.put(self.key, encode(record), lease=self._lease)
            self._written = record
            self.registered.set()

    async def stop(self) -> None:
        """Revoke the lease (the record goes with it) and stop renewing. Never raises."""
        self._stopped = True
        lease, self._lease = self._lease, 0
        self.registered.clear()
        if not lease:
            return
        try:
            await asyncio.wait_for(self._store.revoke_lease(lease), REVOKE_TIMEOUT_S)
        except (StateError, TimeoutError):
            log.warning("could not revoke registration lease %#x; it will expire", lease)

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
from collections.abc import Callable

from gtm.models import GpuWorker
from gtm.state import keys
from gtm.state.publisher import LeasedPublisher
from gtm.state.store import StateStore
from gtm.tasks import TaskSupervisor

#: Lease TTL (s): a dead worker leaves the fleet view within this time. etcd's own
#: clients default to similar values (etcd's `concurrency` sessions use 60 s; routers
#: need faster, llm-d treats 200 ms-old metrics as stale, so 10 s is a compromise
#: between fast removal and keep-alive traffic).
DEFAULT_LEASE_TTL_S = 10.0


class WorkerRegistration:
    """Keeps one worker's record in the store while the worker runs
    (a :class:`gtm.state.publisher.LeasedPublisher` driven by a supervised loop)."""

    def __init__(
        self,
        store: StateStore,
        record: Callable[[], GpuWorker],
        *,
        supervisor: TaskSupervisor,
        ttl: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        self._record = record
        self._supervisor = supervisor
        self._ttl = ttl
        first = record()
        self._publisher = LeasedPublisher(
            store,
            keys.gpu(first.region_id, first.zone_id, first.id),
            ttl_s=ttl,
            what="registration",
        )
        self.key = self._publisher.key
        self._stopped = False
        self.registered = asyncio.Event()

    @property
    def lease_id(self) -> int:
        return self._publisher.lease_id

    def start(self) -> None:
        """Register and keep alive in the background (a keep-alive every TTL / 3)."""
        self._supervisor.run_loop("registration", self._step, interval=self._ttl / 3)

    async def _step(self) -> None:
        if self._stopped:
            return
        try:
            await self._publisher.publish(self._record(), only_changes=True)
        finally:
            # Registered while the record is in the store under the live lease.
            if self._publisher.written is None:
                self.registered.clear()
            else:
                self.registered.set()

    async def stop(self) -> None:
        """Revoke the lease (the record goes with it) and stop renewing. Never raises."""
        self._stopped = True
        self.registered.clear()
        await self._publisher.withdraw()

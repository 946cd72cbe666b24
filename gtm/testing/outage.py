"""A state store that can be switched "down": the verified fake for etcd outages.

:class:`OutageStore` wraps any :class:`~gtm.state.store.StateStore` (usually a
:class:`~gtm.state.memory.MemoryStore`). While :attr:`OutageStore.down` is true every call
raises :class:`~gtm.errors.StateUnavailable` and open watches end with it — the signals
:class:`~gtm.state.etcd.EtcdStore` gives when etcd dies — so static-stability behaviour
can be tested deterministically on a fake clock; the same scenarios run against a real,
killed etcd in the integration suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Generic, Literal, TypeVar

from gtm.errors import StateUnavailable
from gtm.state.store import KeyValue, Lease, RangeResult, StateStore, TxnResult, WatchBatch

S = TypeVar("S", bound=StateStore)


class OutageStore(Generic[S]):
    """Delegates to ``inner``; ``store.down = True`` starts an outage, ``False`` ends it."""

    def __init__(self, inner: S) -> None:
        self.inner = inner
        self.calls = 0  # calls attempted, outage or not
        self._down = False
        self._outage = asyncio.Event()

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, down: bool) -> None:
        self._down = down
        if down:
            self._outage.set()  # ends the watches that are open now
        else:
            self._outage = asyncio.Event()

    def _check(self) -> None:
        self.calls += 1
        if self._down:
            raise StateUnavailable("simulated outage")

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        return await self.inner.get(key)

    async def range(self, prefix: str) -> RangeResult:
        self._check()
        return await self.inner.range(prefix)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self._check()
        return await self.inner.put(key, value, lease=lease)

    async def delete(self, key: str) -> bool:
        self._check()
        return await self.inner.delete(key)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_mod_revision: int, lease: int = 0
    ) -> TxnResult:
        self._check()
        return await self.inner.compare_and_swap(
            key, value, expected_mod_revision=expected_mod_revision, lease=lease
        )

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> TxnResult:
        self._check()
        return await self.inner.compare_and_delete(key, expected_mod_revision=expected_mod_revision)

    async def grant_lease(self, ttl: float) -> Lease:
        self._check()
        return await self.inner.grant_lease(ttl)

    async def keep_alive(self, lease_id: int) -> float:
        self._check()
        return await self.inner.keep_alive(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        self._check()
        await self.inner.revoke_lease(lease_id)

    async def current_revision(self) -> int:
        self._check()
        return await self.inner.current_revision()

    async def compact(self, revision: int) -> None:
        self._check()
        await self.inner.compact(revision)

    def watch(self, prefix: str, *, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        self._check()
        return self._watch(prefix, start_revision)

    async def _watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        outage = self._outage
        stream = self.inner.watch(prefix, start_revision=start_revision)
        racing: tuple[asyncio.Task[WatchBatch], asyncio.Task[Literal[True]]] | None = None
        try:
            while True:
                # Race the next batch against the outage; both are plain awaitables here,
                # owned and cancelled by this generator (not background work).
                next_batch = asyncio.ensure_future(anext(stream))  # noqa: TID251
                lost = asyncio.ensure_future(outage.wait())  # noqa: TID251
                racing = (next_batch, lost)
                done, _ = await asyncio.wait(
                    {next_batch, lost}, return_when=asyncio.FIRST_COMPLETED
                )
                if lost in done:
                    next_batch.cancel()
                    await asyncio.wait({next_batch})  # let it unwind before closing the stream
                    raise StateUnavailable("simulated outage: watch stream lost")
                lost.cancel()
                try:
                    batch = next_batch.result()
                except StopAsyncIteration:
                    return
                yield batch
        finally:
            # Cancelled while waiting (the consumer stopped): the pending read must
            # unwind before the stream can be closed.
            if racing is not None:
                for future in racing:
                    future.cancel()  # no-op when done
                await asyncio.wait({racing[0]})
                await asyncio.wait({racing[1]})
            await stream.aclose()

    async def aclose(self) -> None:
        await self.inner.aclose()

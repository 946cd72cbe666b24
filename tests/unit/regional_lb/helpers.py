"""Shared test helpers for the regional LB: tenants, a store that can fail like an outage."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

from gtm.errors import StateUnavailable
from gtm.state.memory import MemoryStore
from gtm.state.store import KeyValue, Lease, RangeResult, TxnResult, WatchBatch
from policies.documents import Quotas, RegionalShare, Tenant


def quotas(**limits: float) -> Quotas:
    return Quotas.model_validate(limits)


def tenant(
    tenant_id: str = "t1",
    *,
    shares: Mapping[str, float] | None = None,
    limits: Mapping[str, float] | None = None,
) -> Tenant:
    return Tenant(
        id=tenant_id,
        quotas=Quotas.model_validate(dict(limits or {})),
        regional_shares=tuple(RegionalShare(region=r, share=s) for r, s in (shares or {}).items()),
    )


class FlakyStore:
    """Delegates to a MemoryStore; while ``down``, every call fails like an outage."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
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
        return self.inner.watch(prefix, start_revision=start_revision)

    async def aclose(self) -> None:
        await self.inner.aclose()

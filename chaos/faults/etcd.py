"""etcd faults on gtm up's own etcd: kill the leader, stop the whole cluster, compact.

``etcd-kill-leader`` asks the members which one leads, SIGKILLs it (through gtm up's
control API, which owns the processes) and restarts it on rollback, on the same data
directory: it rejoins as a follower. ``etcd-stop`` stops every member (SIGTERM);
rollback starts them all again on their data, so no committed write is lost.
``etcd-compact`` compacts the history up to the current revision (minus ``keep``), so
watchers that fall behind get ``compact_revision`` and must re-list; it cannot be
undone, so its rollback does nothing.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from chaos.deployment import Deployment
from chaos.faults.base import FaultError, Injected, SpecBase
from gtm.errors import StateError


class EtcdKillLeaderFault(SpecBase):
    """SIGKILL the etcd leader (a 3-member cluster keeps a quorum); restart on rollback."""

    kind: Literal["etcd-kill-leader"] = "etcd-kill-leader"

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        if len(deployment.etcd_members) < 3:
            raise FaultError(
                "etcd-kill-leader needs a 3-member etcd (gtm up --etcd-members 3); with "
                f"{len(deployment.etcd_members)} the store just goes down (use etcd-stop)"
            )
        leader = await deployment.etcd_leader()
        await deployment.etcd_kill(leader)

        async def undo() -> None:
            await deployment.etcd_start(leader)

        return Injected(f"SIGKILL etcd leader {leader}", undo)


class EtcdStopFault(SpecBase):
    """Stop every etcd member; rollback restarts them on the same data directories."""

    kind: Literal["etcd-stop"] = "etcd-stop"

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        members = ", ".join(sorted(deployment.etcd_members)) or "none"
        await deployment.etcd_stop_all()

        async def undo() -> None:
            await deployment.etcd_start_all()

        return Injected(f"stop all etcd members ({members})", undo)


class EtcdCompactFault(SpecBase):
    """Compact etcd's history up to the current revision minus ``keep``."""

    kind: Literal["etcd-compact"] = "etcd-compact"
    #: Revisions to keep below the current one (0: compact everything).
    keep: Annotated[int, Field(ge=0)] = 0

    async def inject(self, deployment: Deployment) -> Injected:
        store = deployment.store()
        try:
            current = await store.current_revision()
            target = max(1, current - self.keep)
            await store.compact(target)
        except StateError as exc:
            raise FaultError(f"etcd-compact: {exc}") from None
        return Injected(f"etcd compact at revision {target} (current {current})")

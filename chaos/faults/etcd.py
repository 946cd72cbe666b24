"""etcd faults on gtm up's own etcd: kill the leader, stop the whole cluster, compact.

``etcd-kill-leader`` asks the members which one leads, SIGKILLs it (through gtm up's
control API, which owns the processes) and restarts it on rollback, on the same data
directory: it rejoins as a follower. By default it first moves the leadership to the
member the tiers talk to, so the kill breaks their calls and watches too (see
:attr:`EtcdKillLeaderFault.leader`). ``etcd-stop`` stops every member (SIGTERM);
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
from gtm.state.etcd_cluster import NoLeader


class EtcdKillLeaderFault(SpecBase):
    """SIGKILL the etcd leader (a 3-member cluster keeps a quorum); restart on rollback."""

    kind: Literal["etcd-kill-leader"] = "etcd-kill-leader"
    #: ``clients``: first move the leadership to the member the tiers talk to (the first
    #: of their ``--state``), so the kill takes their connections and watches as well as
    #: the quorum's leader. With the clients on a follower, an election can pass without
    #: a single failed call, and the scenario then cannot tell a tier that drops its
    #: snapshot on a store error from one that serves on (seen: chaos mutant
    #: ``snapshot-dropped`` survived). ``current``: whichever member leads now.
    leader: Literal["clients", "current"] = "clients"

    async def inject(self, deployment: Deployment) -> Injected:
        await deployment.refresh()
        if len(deployment.etcd_members) < 3:
            raise FaultError(
                "etcd-kill-leader needs a 3-member etcd (gtm up --etcd-members 3); with "
                f"{len(deployment.etcd_members)} the store just goes down (use etcd-stop)"
            )
        if self.leader == "clients":
            try:
                await deployment.etcd_make_leader(deployment.etcd_clients_member)
            except NoLeader as exc:
                raise FaultError(f"etcd-kill-leader: {exc}") from None
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

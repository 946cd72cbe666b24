"""A real etcd cluster of N members on loopback: for leader-loss tests, chaos faults and
``gtm up --processes --etcd-members 3``.

Each member is a :class:`~gtm.state.etcd_server.EtcdServer` (same binary discovery, free
ports chosen once, a data directory of its own, ``--initial-cluster`` naming every
member). A member's ``start()`` blocks until it reports healthy, which needs a quorum,
so members start concurrently (one thread each). :meth:`EtcdCluster.leader` asks every
live member ``/v3/maintenance/status`` (etcd's JSON gateway) and returns the one whose
``member_id`` is the ``leader`` they report; waits are bounded by a deadline and poll
every :data:`POLL_S` (process management against real processes: real time).

::

    async with EtcdCluster(tmp_path, members=3) as cluster:
        url = cluster.etcd_url              # etcd://127.0.0.1:p1,127.0.0.1:p2,...
        old = await cluster.leader()
        await cluster.kill(old)
        new = await cluster.wait_leader(not_in={old})
        await cluster.restart(old)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from types import TracebackType

import aiohttp

from gtm.state.etcd_server import (
    HOW_TO_GET_ETCD,
    EtcdServer,
    EtcdStartError,
    find_etcd_binary,
    free_ports,
)

#: How long a leader election may take. etcd elects within ~1 election timeout (here
#: 500 ms, gtm.state.etcd_server.ELECTION_MS); a loaded 2-core machine gets ample room.
LEADER_TIMEOUT_S = 20.0
POLL_S = 0.05
_STATUS_TIMEOUT_S = 1.0


class NoLeader(EtcdStartError):
    """No member reported a leader within the deadline."""


def member_names(count: int) -> tuple[str, ...]:
    return tuple(f"etcd-{i}" for i in range(1, count + 1))


async def member_status(session: aiohttp.ClientSession, client_url: str) -> tuple[int, int] | None:
    """``(member_id, leader_id)`` as the member at ``client_url`` reports them, or None
    when it does not answer (down, or no leader yet: leader 0)."""
    try:
        async with session.post(
            f"{client_url}/v3/maintenance/status",
            json={},
            timeout=aiohttp.ClientTimeout(total=_STATUS_TIMEOUT_S),
        ) as response:
            if response.status != 200:
                return None
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    try:
        # The gateway renders uint64 as JSON strings.
        member, leader = int(body["header"]["member_id"]), int(body["leader"])
    except (KeyError, TypeError, ValueError):
        return None
    return (member, leader) if leader else None


async def find_leader(
    session: aiohttp.ClientSession,
    members: Mapping[str, str],
    *,
    not_in: Collection[str] = (),
    timeout_s: float = LEADER_TIMEOUT_S,
) -> str:
    """The name of the leader among ``members`` (name → client URL), not one of
    ``not_in``; waits up to ``timeout_s`` for one. Raises NoLeader."""
    deadline = time.monotonic() + timeout_s
    while True:
        names = list(members)
        statuses = await asyncio.gather(*(member_status(session, members[n]) for n in names))
        ids = {status[0]: name for name, status in zip(names, statuses, strict=True) if status}
        leaders = {status[1] for status in statuses if status}
        # Every answering member must agree, and the leader must be one that answered.
        if len(leaders) == 1:
            leader = ids.get(next(iter(leaders)))
            if leader is not None and leader not in not_in:
                return leader
        if time.monotonic() > deadline:
            raise NoLeader(
                f"no etcd leader among {', '.join(names)} within {timeout_s:.0f} s "
                f"(answers: {dict(zip(names, statuses, strict=True))})"
            )
        await asyncio.sleep(POLL_S)


async def transfer_leadership(
    session: aiohttp.ClientSession,
    members: Mapping[str, str],
    to: str,
    *,
    timeout_s: float = LEADER_TIMEOUT_S,
) -> None:
    """Make ``to`` the leader of ``members`` (name → client URL): etcd's MoveLeader
    (``/v3/maintenance/transfer-leadership``), sent to the current leader, then waits
    until every answering member agrees (bounded). Raises NoLeader."""
    leader = await find_leader(session, members, timeout_s=timeout_s)
    if leader == to:
        return
    target = await member_status(session, members[to])
    if target is None:
        raise NoLeader(f"etcd member {to} does not answer; leadership cannot move to it")
    try:
        async with session.post(
            f"{members[leader]}/v3/maintenance/transfer-leadership",
            # The gateway reads uint64 fields from JSON strings.
            json={"targetID": str(target[0])},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            if response.status != 200:
                detail = (await response.text())[:200]
                raise NoLeader(f"etcd refused to move leadership to {to}: {detail}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise NoLeader(f"moving etcd leadership to {to} failed: {exc}") from None
    deadline = time.monotonic() + timeout_s
    while await find_leader(session, members, timeout_s=timeout_s) != to:
        if time.monotonic() > deadline:
            raise NoLeader(f"etcd leadership did not move to {to} within {timeout_s:.0f} s")
        await asyncio.sleep(POLL_S)


class EtcdCluster:
    """``members`` etcd members on ``host``, data under ``root``; see the module doc."""

    def __init__(
        self,
        root: Path,
        *,
        members: int = 3,
        host: str = "127.0.0.1",
        fsync: bool = False,
        binary: Path | None = None,
    ) -> None:
        if members < 1:
            raise ValueError("an etcd cluster needs at least one member")
        binary = binary or find_etcd_binary()
        names = member_names(members)
        # Ports are chosen up front, all at once (no duplicates): every member's
        # --initial-cluster names every peer URL.
        ports = iter(free_ports(host, 2 * members))
        addresses = {name: (next(ports), next(ports)) for name in names}
        cluster = ",".join(f"{n}=http://{host}:{peer}" for n, (_, peer) in addresses.items())
        self._members = {
            name: EtcdServer(
                root / name,
                binary=binary,
                host=host,
                port=client,
                peer_port=peer,
                name=name,
                fsync=fsync,
                initial_cluster=cluster,
            )
            for name, (client, peer) in addresses.items()
        }
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ addresses

    @property
    def members(self) -> Mapping[str, EtcdServer]:
        return dict(self._members)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._members)

    @property
    def etcd_url(self) -> str:
        """``etcd://h1:p1,h2:p2,...``: every member, for ``--state``."""
        return "etcd://" + ",".join(f"{m.host}:{m.port}" for m in self._members.values())

    def client_urls(self) -> dict[str, str]:
        return {name: m.client_url for name, m in self._members.items()}

    def member(self, name: str) -> EtcdServer:
        try:
            return self._members[name]
        except KeyError:
            raise KeyError(
                f"no etcd member {name!r}; members: {', '.join(self._members)}"
            ) from None

    # ------------------------------------------------------------------ lifecycle

    async def start_all(self) -> None:
        """Start every member that is not running (concurrently: a quorum is needed
        before any reports healthy) and wait for a leader."""
        stopped = [m for m in self._members.values() if not m.running]
        results = await asyncio.gather(
            *(asyncio.to_thread(m.start) for m in stopped), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop_all()
            raise failures[0]
        await self.leader()

    async def stop_all(self) -> None:
        """SIGTERM every member (they keep their data for :meth:`start_all`).

        One at a time: a member stopping hands leadership to a live one, while stopping
        all at once makes each wait for peers that are going away — several times
        longer in all."""
        for member in self._members.values():
            await asyncio.to_thread(member.stop)

    async def kill_all(self) -> None:
        """SIGKILL every member: a whole-cluster crash (data kept for :meth:`start_all`;
        quicker than :meth:`stop_all`, whose members each try to hand leadership over)."""
        await asyncio.gather(*(asyncio.to_thread(m.kill) for m in self._members.values()))

    async def kill(self, name: str) -> None:
        """SIGKILL one member."""
        await asyncio.to_thread(self.member(name).kill)

    async def stop(self, name: str) -> None:
        await asyncio.to_thread(self.member(name).stop)

    async def restart(self, name: str) -> None:
        """Start a stopped or killed member again on its data; it rejoins the cluster."""
        await asyncio.to_thread(self.member(name).start)

    async def leader(
        self, *, not_in: Collection[str] = (), timeout_s: float = LEADER_TIMEOUT_S
    ) -> str:
        """The leader's name (waits for one, bounded). Raises NoLeader."""
        live = {n: m.client_url for n, m in self._members.items() if m.running}
        if not live:
            raise NoLeader(f"no etcd member is running; to get etcd, {HOW_TO_GET_ETCD}")
        return await find_leader(self._http(), live, not_in=not_in, timeout_s=timeout_s)

    async def make_leader(self, name: str, *, timeout_s: float = LEADER_TIMEOUT_S) -> None:
        """Move the leadership to ``name`` (see :func:`transfer_leadership`)."""
        live = {n: m.client_url for n, m in self._members.items() if m.running}
        if name not in live:
            raise NoLeader(f"etcd member {name} is not running")
        await transfer_leadership(self._http(), live, name, timeout_s=timeout_s)

    async def wait_leader(
        self, *, not_in: Collection[str] = (), timeout_s: float = LEADER_TIMEOUT_S
    ) -> str:
        """Alias of :meth:`leader` that reads better after a kill."""
        return await self.leader(not_in=not_in, timeout_s=timeout_s)

    def pids(self) -> dict[str, int | None]:
        return {name: m.pid for name, m in self._members.items()}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def aclose(self) -> None:
        """Stop every member and close the HTTP session."""
        await self.stop_all()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> EtcdCluster:
        await self.start_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

"""One simulation over several processes: the fleet's regions split between them.

Conservative parallel discrete-event simulation (Chandy–Misra–Bryant, with a global
barrier instead of null messages: Fujimoto, *Parallel and Distributed Simulation
Systems*, 2000, ch. 3). What couples the regions of a run, and how each is kept exact:

* **Global decisions** depend on the global view (rebuilt from region summaries at
  every tick) and on the in-flight ledger (charged by the global decisions alone). Every
  process makes every global decision, in arrival order, on identical state — the same
  choices everywhere — and goes on only with the requests whose region it simulates.
* **Summaries**: at every tick each process publishes its regions' summaries and gets
  the others' (:meth:`Hub.share`) before the global view and the regional views are
  rebuilt, as the live publishers do.
* **Spills** reach the peer region half a round trip after the spill decision
  (:class:`~fleetsim.sim.simulator.Hop`). That delay is the *lookahead*: no process can
  affect another sooner than the shortest one-way latency between regions simulated
  by different processes, so the processes run in windows of that length and swap the
  spills in flight at every window's end (:meth:`Hub.exchange`); a spill always lands
  in a later window.

Ties at equal times break by what happened (tick, arrival, spill, GPU event; spills by
request and hop), never by which process holds what, so a partitioned run ends every
request exactly as the run in one process does (``tests/unit/fleetsim/sim/
test_partition.py`` checks it to the bit). Policies whose region choice reads another
region's live state at every arrival (GORGO, SkyWalker) and runs without a network
(no lookahead) stay in one process.

The processes are forked from the one that built the simulator (nothing is copied or
rebuilt); that one is worker 0 and the hub of the exchanges, over pipes.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetsim.sim.policies import RegionMode
from gtm.errors import SimulationError
from gtm.models import RegionSummary

if TYPE_CHECKING:
    from fleetsim.sim.simulator import Hop, RunResult, Simulator

#: Region choices that depend only on the arrival (and the global tier's own state):
#: the regions can be simulated apart.
PARTITIONABLE = frozenset({RegionMode.GTM, RegionMode.NEAREST_ALLOWED, RegionMode.GEODNS})


@dataclass(frozen=True, slots=True)
class Plan:
    """Which regions each worker simulates, and the windows' length."""

    groups: tuple[frozenset[str], ...]
    #: The shortest one-way latency between regions of different groups (simulated s);
    #: ∞ when no request ever moves between regions after its region is chosen.
    lookahead_s: float

    def worker_of(self, region: str) -> int:
        for k, group in enumerate(self.groups):
            if region in group:
                return k
        raise KeyError(region)


def plan_partition(sim: Simulator, workers: int) -> Plan | None:
    """Split ``sim``'s regions over up to ``workers`` processes, or ``None`` when its
    policy (or ``workers``) leaves nothing to run apart.

    Groups are balanced by GPU count (largest region first, to the lightest group),
    which is what the work follows: the global tier spreads load by capacity.
    """
    if workers < 2 or sim.spec.region_mode not in PARTITIONABLE:
        return None
    gpus: dict[str, int] = {r: 0 for r in sim.region_ids}
    for pool in sim.pools.values():
        gpus[pool.region] += len(pool.gpus)
    busy = [r for r in sim.region_ids if gpus[r] > 0]
    if len(busy) < 2:
        return None
    count = min(workers, len(busy))
    members: list[list[str]] = [[] for _ in range(count)]
    load = [0] * count
    for region in sorted(busy, key=lambda r: (-gpus[r], sim.region_ids.index(r))):
        k = min(range(count), key=lambda j: (load[j], j))
        members[k].append(region)
        load[k] += gpus[region]
    # A region without GPUs never serves; it goes with the first group.
    members[0].extend(r for r in sim.region_ids if gpus[r] == 0)
    groups = tuple(frozenset(m) for m in members)
    lookahead = math.inf
    if sim.hier:
        if not sim.network:
            return None  # spills land at once: no lookahead
        for k, group in enumerate(groups):
            for other in groups[k + 1 :]:
                for a in group:
                    for b in other:
                        lookahead = min(lookahead, sim.rtt.between(a, b) / 2.0 / 1000.0)
        if not lookahead > 0.0:
            return None
    return Plan(groups, lookahead)


# ------------------------------------------------------------------------ messages

_OK = "ok"
_ERROR = "error"


def _checked(conn: Connection, worker: int) -> Any:
    try:
        tag, body = conn.recv()
    except EOFError:
        raise SimulationError(f"simulation worker {worker} exited without a word") from None
    if tag == _ERROR:
        raise SimulationError(f"simulation worker {worker} failed:\n{body}")
    return body


class _Hub:
    """Worker 0's end of the exchanges: it talks to every other worker."""

    def __init__(self, plan: Plan, conns: Sequence[Connection]) -> None:
        self._plan = plan
        self._conns = conns

    def exchange(self, outbox: list[Hop], busy: bool) -> tuple[list[Hop], bool]:
        """Swap the spills in flight; returns this worker's, and whether any worker
        has anything left to simulate."""
        inboxes: list[list[Hop]] = [[] for _ in self._plan.groups]
        any_busy = busy
        for hop in outbox:
            inboxes[self._plan.worker_of(hop.region)].append(hop)
        for k, conn in enumerate(self._conns, start=1):
            hops, child_busy = _checked(conn, k)
            any_busy = any_busy or child_busy
            for hop in hops:
                inboxes[self._plan.worker_of(hop.region)].append(hop)
        for k, conn in enumerate(self._conns, start=1):
            conn.send((_OK, (inboxes[k], any_busy)))
        return inboxes[0], any_busy

    def share(self, mine: Mapping[str, RegionSummary]) -> dict[str, RegionSummary]:
        every = dict(mine)
        for k, conn in enumerate(self._conns, start=1):
            every.update(_checked(conn, k))
        for conn in self._conns:
            conn.send((_OK, every))
        return every


class _Spoke:
    """Another worker's end: it talks to the hub only (sends first, then reads: the
    hub reads first, so neither waits on a full pipe)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def exchange(self, outbox: list[Hop], busy: bool) -> tuple[list[Hop], bool]:
        self._conn.send((_OK, (outbox, busy)))
        hops: list[Hop]
        hops, any_busy = _checked(self._conn, 0)
        return hops, any_busy

    def share(self, mine: Mapping[str, RegionSummary]) -> dict[str, RegionSummary]:
        self._conn.send((_OK, dict(mine)))
        every: dict[str, RegionSummary] = _checked(self._conn, 0)
        return every


_Link = _Hub | _Spoke


# ------------------------------------------------------------------------ the run


def _simulate(sim: Simulator, plan: Plan, link: _Link) -> float:
    """Run this worker's regions window by window; returns the next tick not run."""
    horizon = sim.duration_s + sim.drain_s
    tick_s, lookahead = sim.tick_s, plan.lookahead_s
    next_tick, start = tick_s, 0.0
    hops = sim.hops
    while True:
        at_tick = next_tick <= horizon and start + lookahead >= next_tick
        barrier = next_tick if at_tick else min(start + lookahead, horizon)
        last = not at_tick and barrier >= horizon
        next_tick = sim.advance(barrier, inclusive=last, next_tick=next_tick, ticks=False)
        for hop in sim.outbox:
            if hop.at < barrier:  # the lookahead promises this never happens
                raise SimulationError(
                    f"a spill to {hop.region} lands at {hop.at:.6f} s, inside the window "
                    f"ending {barrier:.6f} s: the lookahead ({lookahead:.6f} s) is wrong"
                )
        inbox, busy = link.exchange(sim.outbox, sim.busy())
        sim.outbox = []
        for hop in inbox:
            heapq.heappush(hops, (hop.at, hop.index, hop.hops, hop))
        if at_tick:
            if not busy:
                return next_tick  # nothing left anywhere: the run is over
            sim.tick(next_tick)
            next_tick += tick_s
        elif last:
            return next_tick
        start = barrier


@dataclass(frozen=True, slots=True)
class _Share:
    """What a child worker hands back: its part of the results."""

    ended: np.ndarray
    status: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    region: np.ndarray
    gpu: np.ndarray
    home: np.ndarray
    cached: np.ndarray
    violation: np.ndarray
    ends: np.ndarray
    reason: list[str]
    gpus: np.ndarray
    busy_s: np.ndarray
    busy_window_s: np.ndarray
    regions: np.ndarray
    util: list[tuple[float, tuple[float, ...]]]
    max_kv_fraction: float
    spills: int
    prefix_hit_tokens: int
    prefix_queried_tokens: int
    tier_s: dict[str, float]


_OUTCOME_ARRAYS = (
    "status",
    "ttft_s",
    "e2e_s",
    "region",
    "gpu",
    "home",
    "cached",
    "violation",
    "ends",
)


def _share_of(sim: Simulator, result: RunResult) -> _Share:
    out = result.outcomes
    ended = np.flatnonzero(out.ends > 0)
    owned_gpus = np.array(
        [k for k, p in enumerate(sim.gpu_pool) if p.region in sim.owned], dtype=np.int64
    )
    regions = np.array([k for k, r in enumerate(sim.region_ids) if r in sim.owned], dtype=np.int64)
    return _Share(
        ended,
        *(getattr(out, name)[ended] for name in _OUTCOME_ARRAYS),
        [out.reason[j] for j in ended],
        owned_gpus,
        result.gpu_busy_s[owned_gpus],
        result.gpu_busy_window_s[owned_gpus],
        regions,
        result.util_timeline,
        result.max_kv_fraction,
        result.spills,
        result.prefix_hit_tokens,
        result.prefix_queried_tokens,
        result.tier_wall_s,
    )


def _merge(result: RunResult, share: _Share) -> RunResult:
    out = result.outcomes
    for name in _OUTCOME_ARRAYS:
        getattr(out, name)[share.ended] = getattr(share, name)
    for j, reason in zip(share.ended.tolist(), share.reason, strict=True):
        out.reason[j] = reason
    result.gpu_busy_s[share.gpus] = share.busy_s
    result.gpu_busy_window_s[share.gpus] = share.busy_window_s
    if len(result.util_timeline) != len(share.util):
        raise SimulationError("simulation workers ticked apart (a bug)")
    columns = set(share.regions.tolist())
    result.util_timeline = [
        (at, tuple(theirs[k] if k in columns else v for k, v in enumerate(ours)))
        for (at, ours), (_, theirs) in zip(result.util_timeline, share.util, strict=True)
    ]
    result.max_kv_fraction = max(result.max_kv_fraction, share.max_kv_fraction)
    result.spills += share.spills
    result.prefix_hit_tokens += share.prefix_hit_tokens
    result.prefix_queried_tokens += share.prefix_queried_tokens
    result.tier_wall_s = {k: v + share.tier_s.get(k, 0.0) for k, v in result.tier_wall_s.items()}
    return result


def _own(sim: Simulator, group: frozenset[str]) -> None:
    sim.owned = group
    sim.owned_gpus = [
        g for g, p in zip(sim.gpu_list, sim.gpu_pool, strict=True) if p.region in group
    ]


def _child(sim: Simulator, plan: Plan, worker: int, conn: Connection) -> None:
    """A forked worker: simulate its regions, hand back its share, exit."""
    code = 1
    try:
        _own(sim, plan.groups[worker])
        sim.progress = None
        link = _Spoke(conn)
        sim.link = link
        next_tick = _simulate(sim, plan, link)
        result = sim.finish(0.0, next_tick)
        conn.send((_OK, _share_of(sim, result)))
        code = 0
    except BaseException:  # everything goes back to the hub, then exit
        # The hub may be gone already (it failed first): nothing left to tell then.
        with contextlib.suppress(OSError):
            conn.send((_ERROR, traceback.format_exc()))
    finally:
        conn.close()
        os._exit(code)


def run_partitioned(sim: Simulator, plan: Plan, started: float) -> RunResult:
    """``sim.run()`` over ``len(plan.groups)`` processes (this one and forked ones)."""
    conns: list[Connection] = []
    pids: list[int] = []
    done = False
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for worker in range(1, len(plan.groups)):
            ours, theirs = Pipe(duplex=True)
            pid = os.fork()
            if pid == 0:  # the child: never returns
                ours.close()
                for other in conns:
                    other.close()
                _child(sim, plan, worker, theirs)
            theirs.close()
            conns.append(ours)
            pids.append(pid)
        _own(sim, plan.groups[0])
        hub = _Hub(plan, conns)
        sim.link = hub
        next_tick = _simulate(sim, plan, hub)
        result = sim.finish(started, next_tick)
        for k, conn in enumerate(conns, start=1):
            result = _merge(result, _checked(conn, k))
        result.workers = len(plan.groups)
        result.wall_s = time.perf_counter() - started
        done = True
        return result
    finally:
        for conn in conns:
            conn.close()
        for pid in pids:
            _reap(pid, stop=not done)
        sim.link = None


def _reap(pid: int, *, stop: bool) -> None:
    """Wait for a worker's exit; ``stop`` it first (the run failed: it may be waiting
    for an exchange that will never come)."""
    try:
        if stop:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


__all__ = ["PARTITIONABLE", "Plan", "plan_partition", "run_partitioned"]

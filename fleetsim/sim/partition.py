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
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from types import MappingProxyType
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
    #: Region → the worker (index in ``groups``) that simulates it.
    worker: Mapping[str, int]


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
                        # Both ways: the measured table is not symmetric.
                        for rtt_ms in (sim.rtt.between(a, b), sim.rtt.between(b, a)):
                            lookahead = min(lookahead, rtt_ms / 2.0 / 1000.0)
        if not lookahead > 0.0:
            return None
    worker = MappingProxyType({r: k for k, g in enumerate(groups) for r in g})
    return Plan(groups, lookahead, worker)


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


Arrivals = list[tuple[float, int, str]]


class _Timed:
    """Counts the seconds a worker spends in exchanges (waiting for the others, mostly)."""

    waited_s = 0.0

    def _timed(self, started: float) -> None:
        self.waited_s += time.perf_counter() - started


class _Hub(_Timed):
    """Worker 0's end of the exchanges: it talks to every other worker."""

    def __init__(self, plan: Plan, conns: Sequence[Connection]) -> None:
        self.plan = plan
        self._conns = conns

    def exchange(
        self, outbox: list[Hop], busy: bool, feeds: list[Arrivals] | None
    ) -> tuple[list[Hop], bool, Arrivals | None]:
        """Swap the spills in flight (and hand out the next window's arrivals);
        returns this worker's spills, whether any worker has anything left to
        simulate, and this worker's arrivals."""
        started = time.perf_counter()
        plan = self.plan
        inboxes: list[list[Hop]] = [[] for _ in plan.groups]
        any_busy = busy
        for hop in outbox:
            inboxes[plan.worker[hop.region]].append(hop)
        for k, conn in enumerate(self._conns, start=1):
            hops, child_busy = _checked(conn, k)
            any_busy = any_busy or child_busy
            for hop in hops:
                inboxes[plan.worker[hop.region]].append(hop)
        for k, conn in enumerate(self._conns, start=1):
            conn.send((_OK, (inboxes[k], any_busy, None if feeds is None else feeds[k])))
        self._timed(started)
        return inboxes[0], any_busy, None if feeds is None else feeds[0]

    def send_feeds(self, feeds: list[Arrivals]) -> Arrivals:
        started = time.perf_counter()
        for k, conn in enumerate(self._conns, start=1):
            conn.send((_OK, feeds[k]))
        self._timed(started)
        return feeds[0]

    def share(self, mine: Mapping[str, RegionSummary]) -> dict[str, RegionSummary]:
        started = time.perf_counter()
        every = dict(mine)
        for k, conn in enumerate(self._conns, start=1):
            every.update(_checked(conn, k))
        for conn in self._conns:
            conn.send((_OK, every))
        self._timed(started)
        return every


class _Spoke(_Timed):
    """Another worker's end: it talks to the hub only (sends first, then reads: the
    hub reads first, so neither waits on a full pipe)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def exchange(
        self, outbox: list[Hop], busy: bool, feeds: list[Arrivals] | None
    ) -> tuple[list[Hop], bool, Arrivals | None]:
        started = time.perf_counter()
        self._conn.send((_OK, (outbox, busy)))
        hops: list[Hop]
        fed: Arrivals | None
        hops, any_busy, fed = _checked(self._conn, 0)
        self._timed(started)
        return hops, any_busy, fed

    def feed(self) -> Arrivals:
        started = time.perf_counter()
        fed: Arrivals = _checked(self._conn, 0)
        self._timed(started)
        return fed

    def share(self, mine: Mapping[str, RegionSummary]) -> dict[str, RegionSummary]:
        started = time.perf_counter()
        self._conn.send((_OK, dict(mine)))
        every: dict[str, RegionSummary] = _checked(self._conn, 0)
        self._timed(started)
        return every


_Link = _Hub | _Spoke


# ------------------------------------------------------------------------ the run


@dataclass(slots=True)
class _Windows:
    """The barriers of a run: every tick, and every ``lookahead`` in between."""

    horizon: float
    tick_s: float
    lookahead: float
    start: float = 0.0
    next_tick: float = 0.0

    def next(self) -> tuple[float, bool, bool]:
        """(barrier, whether it is a tick, whether it ends the run: inclusive)."""
        at_tick = self.next_tick <= self.horizon and self.start + self.lookahead >= self.next_tick
        if at_tick:
            return self.next_tick, True, False
        barrier = min(self.start + self.lookahead, self.horizon)
        return barrier, False, barrier >= self.horizon


def _simulate(sim: Simulator, plan: Plan, link: _Link) -> float:
    """Run this worker's regions window by window; returns the next tick not run.

    In a gtm run worker 0 makes every global decision a window ahead: the choices for
    the next window go to the other workers with the exchange that ends this one, or,
    when a tick ends it, right after the tick (they need its new global view)."""
    windows = _Windows(sim.duration_s + sim.drain_s, sim.tick_s, plan.lookahead_s)
    windows.next_tick = sim.tick_s
    decides = isinstance(link, _Hub) and sim.feed is not None
    barrier, at_tick, last = windows.next()
    _next_feed(sim, link, barrier, last, decides, separate=True)
    while True:
        windows.next_tick = sim.advance(
            barrier, inclusive=last, next_tick=windows.next_tick, ticks=False
        )
        if last:
            return windows.next_tick
        for hop in sim.outbox:
            if hop.at < barrier:  # the lookahead promises this never happens
                raise SimulationError(
                    f"a spill to {hop.region} lands at {hop.at:.6f} s, inside the window "
                    f"ending {barrier:.6f} s: the lookahead ({plan.lookahead_s:.6f} s) is "
                    "wrong"
                )
        windows.start = barrier
        feeds = None
        if not at_tick:
            barrier_next, tick_next, last_next = windows.next()
            if decides:
                feeds = sim.decide_until(barrier_next, last_next, len(plan.groups), plan.worker)
        inbox, busy, fed = link.exchange(sim.outbox, sim.busy(), feeds)
        sim.outbox = []
        for hop in inbox:
            heapq.heappush(sim.hops, (hop.at, hop.index, hop.hops, hop))
        if at_tick:
            if not busy:
                return windows.next_tick  # nothing left anywhere: the run is over
            sim.tick(windows.next_tick)
            windows.next_tick += sim.tick_s
            barrier_next, tick_next, last_next = windows.next()
            _next_feed(sim, link, barrier_next, last_next, decides, separate=True)
        elif sim.feed is not None and fed is not None:
            sim.feed.extend(fed)
        barrier, at_tick, last = barrier_next, tick_next, last_next


def _next_feed(
    sim: Simulator, link: _Link, barrier: float, last: bool, decides: bool, *, separate: bool
) -> None:
    """The next window's arrivals, in a message of their own (the first window, and
    after a tick)."""
    if sim.feed is None:
        return
    if decides:
        assert isinstance(link, _Hub)
        feeds = sim.decide_until(barrier, last, len(link.plan.groups), link.plan.worker)
        sim.feed.extend(link.send_feeds(feeds))
    else:
        assert isinstance(link, _Spoke)
        sim.feed.extend(link.feed())


@dataclass(frozen=True, slots=True)
class _Share:
    """What a child worker hands back: its part of the results."""

    ended: np.ndarray
    status: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    region: np.ndarray
    gpu: np.ndarray
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
    waited_s: float


#: What a worker that ended a request knows of it. (Not ``home``: worker 0 sets it for
#: every request, and a spilled request's last worker never saw it arrive.)
_OUTCOME_ARRAYS = ("status", "ttft_s", "e2e_s", "region", "gpu", "cached", "violation", "ends")


def _share_of(sim: Simulator, result: RunResult, waited_s: float) -> _Share:
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
        waited_s,
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
    result.worker_waited_s = (*result.worker_waited_s, share.waited_s)
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
        if sim.feed is not None:
            sim.next_arrival = len(sim.requests)  # worker 0 decides them all
        link = _Spoke(conn)
        sim.link = link
        next_tick = _simulate(sim, plan, link)
        result = sim.finish(0.0, next_tick)
        conn.send((_OK, _share_of(sim, result, link.waited_s)))
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
    if sim.hier:
        sim.feed = deque()
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
        result.worker_waited_s = (hub.waited_s,)
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

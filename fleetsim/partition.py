"""One simulation over several processes: the fleet's regions split between them.

Conservative parallel discrete-event simulation (Chandy and Misra, "Distributed
simulation: a case study in design and verification of distributed programs", IEEE TSE
1979; Fujimoto, *Parallel and Distributed Simulation Systems*, 2000, ch. 3): a worker
simulates only what no other worker can still change. What couples the regions of a
run, and how each is kept exact:

* **Global decisions** depend on the global view (rebuilt from region summaries at
  every tick) and on the in-flight ledger, which only global decisions charge. Worker 0
  makes every one of them, in arrival order, ahead of the others, and feeds each worker
  the arrivals that enter its regions (:meth:`fleetsim.routing.Routing.decide_until`).
* **Messages between regions** — a spilled request reaching its peer
  (:class:`~fleetsim.events.Hop`), the end of a spilled request reaching the
  region that admitted it (:class:`~fleetsim.events.Release`) — take at least the
  shortest one-way latency between regions of different workers: the *lookahead*. Each
  worker publishes its progress (every event before it done, every message those events
  made sent) in shared memory; another may simulate anything before that progress plus
  the lookahead. No window, no barrier: a worker waits only when it is a lookahead ahead.
* **Summaries**: at every tick (1 simulated s) the workers meet, tell whether anything is
  left anywhere, and swap their regions' summaries before the views are rebuilt, as the
  live publishers do.

Ties at equal times break by what happened (tick, arrival, message, GPU event; messages
by time, request and kind), never by which worker holds what, so a partitioned run ends
every request exactly as the run in one process does (``tests/unit/fleetsim/
test_partition.py`` checks it to the bit). Policies whose region choice reads another
region's live state at every arrival (GORGO, SkyWalker), and runs without a network
(no lookahead), stay in one process.

The workers are forked from the process that built the simulator (nothing is copied or
rebuilt); that one is worker 0. Every pair of workers has a pipe.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import math
import mmap
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from gtm.errors import SimulationError
from gtm.models import RegionSummary

if TYPE_CHECKING:
    from fleetsim.events import Message
    from fleetsim.results import RunResult
    from fleetsim.simulator import Simulator


@dataclass(frozen=True, slots=True)
class Plan:
    """Which regions each worker simulates, and how far ahead of the others it may run."""

    groups: tuple[frozenset[str], ...]
    #: The shortest one-way latency between regions of different groups (simulated s);
    #: ∞ when no request ever moves between regions after its region is chosen.
    lookahead_s: float
    #: Region → the worker (index in ``groups``) that simulates it.
    worker: Mapping[str, int]


#: Worker 0's global decisions, as a share of a run's work with a global tier (measured
#: with ``bench/fleet_scale.py``). The plan gives worker 0 that much less regional work.
GLOBAL_SHARE = 0.15
#: Lookahead below which a split is avoided when another exists (s): a shorter one
#: makes the workers wait on each other more often (eu-west and eu-central, say).
SHORT_LOOKAHEAD_S = 0.025
#: Exhaustive search up to this many assignments; greedy beyond.
SEARCH_LIMIT = 100_000


def plan_partition(sim: Simulator, workers: int) -> Plan | None:
    """Split ``sim``'s regions over up to ``workers`` processes, or ``None`` when its
    policy (or ``workers``) leaves nothing to run apart.

    A region's work is counted by where the probe's arrivals go (:func:`_probe`); in a
    gtm run worker 0 also makes every global decision (:data:`GLOBAL_SHARE`). The plan
    minimises the busiest worker's load, among the splits whose lookahead is at least
    :data:`SHORT_LOOKAHEAD_S` if there are any.
    """
    if workers < 2 or not sim.routing.partitionable:
        return None
    work = _probe(sim)
    serving = [r for r in sim.region_ids if work[r] > 0]
    count = min(workers, len(serving))
    if count < 2:
        return None
    extra = (
        sum(work.values()) * GLOBAL_SHARE / (1.0 - GLOBAL_SHARE) if sim.routing.GLOBAL_TIER else 0.0
    )
    best: tuple[tuple[bool, float, float], tuple[frozenset[str], ...], float] | None = None
    for members in _splits(serving, count, work):
        groups = tuple(frozenset(m) for m in members)
        lookahead = _lookahead(sim, groups)
        load = max(extra * (k == 0) + sum(work[r] for r in m) for k, m in enumerate(members))
        key = (lookahead < SHORT_LOOKAHEAD_S, load, -lookahead)
        if best is None or key < best[0]:
            best = (key, groups, lookahead)
    assert best is not None
    _, groups, lookahead = best
    if not lookahead > 0.0:
        return None
    # A region without GPUs never serves; it goes with worker 0.
    idle = frozenset(r for r in sim.region_ids if work[r] == 0)
    groups = (groups[0] | idle, *groups[1:])
    worker = MappingProxyType({r: k for k, g in enumerate(groups) for r in g})
    return Plan(groups, lookahead, worker)


def _probe(sim: Simulator) -> dict[str, float]:
    """Each region's share of the work: where the first :data:`PROBE_ARRIVALS`
    arrivals (at most 5 % of the window) go, by the policy's own region choice, in a
    forked process (nothing here changes): :meth:`fleetsim.routing.Routing.probe`. With
    a global tier, its decisions alone, in arrival order on the starting view — a small
    fraction of simulating those arrivals whole, for nearly the same split. Neither GPU
    counts nor capacities tell it: where the clients are decides which regions work."""
    ours, theirs = Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the probe: never returns
        code = 1
        try:
            ours.close()
            theirs.send((_RESULT, sim.routing.probe(probe_seconds(sim))))
            code = 0
        except BaseException:
            with contextlib.suppress(OSError):
                theirs.send((_ERROR, traceback.format_exc()))
        finally:
            os._exit(code)
    theirs.close()
    try:
        try:
            tag, body = ours.recv()
        except EOFError:
            raise SimulationError("the partition probe exited without a word") from None
        if tag == _ERROR:
            raise SimulationError(f"the partition probe failed:\n{body}")
    finally:
        ours.close()
        _reap(pid, stop=False)
    return {r: float(body[r]) + 1.0 if sim.region_pools[r] else 0.0 for r in sim.region_ids}


#: The partition probe looks at most this many arrivals (enough for each region's share
#: within a couple of %; at 10,000 GPUs that is under a simulated second).
PROBE_ARRIVALS = 4_000


def probe_seconds(sim: Simulator) -> float:
    """How much of the run the partition probe looks at: 5 % of the arrival window,
    at most :data:`PROBE_ARRIVALS` arrivals' worth, at least 1 s."""
    requests = sim.requests
    seconds = 0.05 * sim.duration_s
    if len(requests) > PROBE_ARRIVALS:
        seconds = min(seconds, requests[PROBE_ARRIVALS].at_s)
    return max(1.0, seconds)


def _splits(
    regions: Sequence[str], count: int, weight: Mapping[str, float]
) -> Iterator[list[list[str]]]:
    """Every split of ``regions`` into ``count`` non-empty groups (or, when there are
    too many, the greedy one: heaviest region first, to the lightest group)."""
    if count ** len(regions) <= SEARCH_LIMIT:
        for labels in itertools.product(range(count), repeat=len(regions)):
            if len(set(labels)) == count:
                members: list[list[str]] = [[] for _ in range(count)]
                for region, k in zip(regions, labels, strict=True):
                    members[k].append(region)
                yield members
        return
    members = [[] for _ in range(count)]
    load = [0.0] * count
    for region in sorted(regions, key=lambda r: (-weight[r], regions.index(r))):
        k = min(range(count), key=lambda j: (load[j], j))
        members[k].append(region)
        load[k] += weight[region]
    yield members


#: Taken off the lookahead (s). A message sent at ``t`` lands at ``t + one-way``, and
#: another worker may run to ``progress + lookahead``: equal in exact arithmetic, but the
#: two sums are rounded apart, and a 10,000-GPU run once had a spill land 2 ulps
#: (2·10⁻¹⁴ s) before the receiver's progress ("in this worker's past"). A microsecond
#: is far above any rounding of times below 10⁹ s and costs nothing against 35 ms.
LOOKAHEAD_MARGIN_S = 1e-6


def _lookahead(sim: Simulator, groups: Sequence[frozenset[str]]) -> float:
    """The shortest one-way latency between regions of different groups (s), less
    :data:`LOOKAHEAD_MARGIN_S`; ∞ when a request never moves between regions once its
    region is chosen."""
    if not sim.routing.GLOBAL_TIER:
        return math.inf
    lookahead = math.inf
    for k, group in enumerate(groups):
        for other in groups[k + 1 :]:
            for a in group:
                for b in other:
                    # Both ways: the measured table is not symmetric.
                    for rtt_ms in (sim.rtt.between(a, b), sim.rtt.between(b, a)):
                        lookahead = min(lookahead, rtt_ms / 2.0 / 1000.0)
    return max(0.0, lookahead - LOOKAHEAD_MARGIN_S)


# ------------------------------------------------------------------------ messages

_MESSAGES = "messages"
_FEED = "feed"
_BUSY = "busy"
_SUMMARIES = "summaries"
_RESULT = "result"
_ERROR = "error"

#: Arrivals past the global tier, for one worker: (time, request, region).
Arrivals = list[tuple[float, int, str]]

#: Doubles between two clocks: one 64-byte cache line each. A worker moves its clock at
#: every event while the others read theirs; sharing a line would bounce it between
#: the cores at every write (false sharing).
STRIDE = 8


class _Peers:
    """One worker's pipes to every other worker, and the clocks all of them share.

    ``clocks[k · STRIDE]`` is worker k's *progress*: it has simulated every event before that
    time and sent every spill those events made. Another worker may therefore simulate
    anything before ``clocks[k] + lookahead`` — nothing worker k does later can land
    sooner. ``clocks[(n + k) · STRIDE]``: worker 0 has sent worker k every arrival before that
    time (a gtm run). The clocks live in memory shared by the forked workers and are
    written after the messages they vouch for, so a reader that sees a clock and then
    reads its pipes has every message that clock covers.
    """

    def __init__(
        self,
        me: int,
        plan: Plan,
        conns: Mapping[int, Connection],
        clocks: ctypes.Array[ctypes.c_double],
        counters: ctypes.Array[ctypes.c_int64],
    ) -> None:
        self.me = me
        self.plan = plan
        self.conns = conns
        self.clocks = clocks
        self.n = len(plan.groups)
        #: Seconds spent waiting for another worker (at a tick, or > lookahead ahead).
        self.waited_s = 0.0
        self.sim: Simulator | None = None
        #: This worker's own progress (what it last published).
        self.done = 0.0
        #: Messages read while looking for another kind, per sender.
        self._held: dict[int, list[tuple[str, Any]]] = {k: [] for k in conns}
        #: Workers that finished the run and closed their pipes.
        self._finished: set[int] = set()
        #: Messages each worker sent each other one, in shared memory (see _send).
        self.counters = counters
        #: Messages read from each other worker.
        self._received = {k: 0 for k in conns}

    # -- clocks

    def publish(self, at: float) -> None:
        """Progress to ``at``: send the messages made so far, then move the clock."""
        sim = self.sim
        assert sim is not None
        if sim.outbox:
            self._send_messages(sim.outbox)
            sim.outbox = []
        self.clocks[self.me * STRIDE] = at
        self.done = at

    def safe(self, fed: bool) -> float:
        """The time before which this worker may simulate everything."""
        lookahead = self.plan.lookahead_s
        clocks = self.clocks
        bound = math.inf
        for k in self.conns:
            bound = min(bound, clocks[k * STRIDE] + lookahead)
        if fed:
            bound = min(bound, clocks[(self.n + self.me) * STRIDE])
        return bound

    def fed_until(self, worker: int, at: float) -> None:
        self.clocks[(self.n + worker) * STRIDE] = at

    # -- messages

    def _send_messages(self, hops: list[Message]) -> None:
        by_worker: dict[int, list[Message]] = {}
        for hop in hops:
            # Sent at the latest when the clock next moves: made by an event at or after
            # the clock's last value, so it lands a lookahead later at least.
            if hop.at < self.done + self.plan.lookahead_s:
                raise SimulationError(
                    f"{type(hop).__name__} of request {hop.index} to {hop.region} lands at "
                    f"{hop.at!r} s, sooner than this worker's progress {self.done!r} s + the "
                    f"lookahead {self.plan.lookahead_s!r} s"
                )
            by_worker.setdefault(self.plan.worker[hop.region], []).append(hop)
        for k, mine in by_worker.items():
            self._send(k, (_MESSAGES, mine))

    def send_feeds(self, feeds: Sequence[Arrivals], until: float) -> None:
        for k in self.conns:
            self._send(k, (_FEED, feeds[k]))
            self.fed_until(k, until)

    def _send(self, k: int, message: tuple[str, Any]) -> None:
        """Send worker k a message, then count it (the count is what tells k to read)."""
        try:
            self.conns[k].send(message)
        except (BrokenPipeError, ConnectionResetError):
            self._gone(k)
        slot = self._counter(self.me, k)
        self.counters[slot] = self.counters[slot] + 1

    def _gone(self, k: int) -> NoReturn:
        """Worker k closed its end of the pipe mid-run: raise with what it said last (a
        failing worker sends its traceback, then exits), not with the broken pipe."""
        conn = self.conns[k]
        with contextlib.suppress(EOFError, OSError):
            while conn.poll():
                tag, body = conn.recv()
                if tag == _ERROR:
                    raise SimulationError(f"simulation worker {k} failed:\n{body}")
        raise SimulationError(f"simulation worker {k} exited without a word")

    def send_result(self, share: _Share) -> None:
        self._send(0, (_RESULT, share))

    def _counter(self, sender: int, receiver: int) -> int:
        return (sender * self.n + receiver) * STRIDE

    def drain(self) -> None:
        """Take in whatever the others sent (messages, arrivals); never blocks. The
        shared counts say how many messages wait in each pipe: no system call when
        none does (a poll per step cost worker 0 a tenth of its time)."""
        counters = self.counters
        for k in self.conns:
            waiting = counters[self._counter(k, self.me)] - self._received[k]
            for _ in range(waiting):
                message = self._recv(k)
                if message is not None:
                    self._take(k, message)

    def _poll(self) -> None:
        """Read the pipes themselves: also what the counts do not cover (a failed
        worker's last word, a finished one's end of pipe)."""
        for k, conn in self.conns.items():
            while k not in self._finished and conn.poll():
                message = self._recv(k)
                if message is not None:
                    self._take(k, message)

    def _recv(self, k: int) -> tuple[str, Any] | None:
        """Worker k's next message; ``None`` when it has finished the run and closed its
        end of the pipe (it published the end of the run, ∞, first): not a failure."""
        try:
            tag, body = self.conns[k].recv()
            self._received[k] += 1
        except EOFError:
            if self.clocks[k * STRIDE] == math.inf:
                self._finished.add(k)
                return None
            raise SimulationError(f"simulation worker {k} exited without a word") from None
        if tag == _ERROR:
            raise SimulationError(f"simulation worker {k} failed:\n{body}")
        return tag, body

    def _take(self, k: int, message: tuple[str, Any]) -> None:
        sim = self.sim
        assert sim is not None
        tag, body = message
        if tag == _MESSAGES:
            horizon = sim.duration_s + sim.drain_s
            for hop in body:
                if hop.at > horizon:
                    continue  # lands after the run (as in one process: never simulated)
                if hop.at < self.done:
                    raise SimulationError(
                        f"{type(hop).__name__} of request {hop.index} from worker {k} lands "
                        f"at {hop.at!r} s, in this worker's past ({self.done!r} s)"
                    )
                heapq.heappush(sim.messages, (hop.at, hop.index, hop.order, hop))
        elif tag == _FEED:
            assert sim.feed is not None
            sim.feed.extend(body)
        else:
            self._held[k].append(message)

    def _expect(self, k: int, tag: str) -> Any:
        """Worker k's next message of kind ``tag`` (taking in what comes before it)."""
        held = self._held[k]
        while True:
            for j, (kind, body) in enumerate(held):
                if kind == tag:
                    del held[j]
                    return body
            message = self._recv(k)
            if message is None:
                raise SimulationError(f"simulation worker {k} ended before sending {tag!r}")
            self._take(k, message)

    def wait(self) -> None:
        """Nothing to simulate until another worker moves on: look again shortly."""
        started = time.perf_counter()
        self._poll()
        os.sched_yield()
        self.waited_s += time.perf_counter() - started

    # -- at a tick: every worker in step

    def anyone_busy(self, busy: bool) -> bool:
        started = time.perf_counter()
        for k in self.conns:
            self._send(k, (_BUSY, busy))
        for k in self.conns:
            busy = self._expect(k, _BUSY) or busy
        self.waited_s += time.perf_counter() - started
        return busy

    def share(self, mine: Mapping[str, RegionSummary]) -> dict[str, RegionSummary]:
        """Every region's summary (this worker's and the others'), in the fleet's order."""
        started = time.perf_counter()
        for k in self.conns:
            self._send(k, (_SUMMARIES, dict(mine)))
        every = dict(mine)
        for k in self.conns:
            every.update(self._expect(k, _SUMMARIES))
        self.waited_s += time.perf_counter() - started
        sim = self.sim
        assert sim is not None
        return {r: every[r] for r in sim.region_ids if r in every}


# ------------------------------------------------------------------------ the run

#: How far ahead of its own progress worker 0 decides arrivals, in lookaheads: the
#: others may run one lookahead past worker 0, and need their arrivals for it.
DECIDE_AHEAD = 2.0


def _simulate(sim: Simulator, peers: _Peers) -> float:
    """Run this worker's regions to the horizon; returns the next tick not run.

    Between ticks a worker simulates as far as the others' clocks allow (and, in a gtm
    run, as far as worker 0 has decided arrivals for it); at a tick all of them meet,
    tell whether anything is left, and swap summaries."""
    horizon = sim.duration_s + sim.drain_s
    lookahead = peers.plan.lookahead_s
    decides = sim.feed is not None and peers.me == 0
    fed = sim.feed is not None and peers.me != 0
    next_tick = sim.tick_s
    decided = 0.0
    done = 0.0
    while True:
        at_tick = next_tick <= horizon
        bound = next_tick if at_tick else horizon
        while True:
            # The clocks before the pipes: messages are sent before the clocks move.
            safe = peers.safe(fed)
            peers.drain()
            final = not at_tick and safe > bound
            target = min(safe, bound)
            if decides and decided != math.inf:
                upto = min(target + DECIDE_AHEAD * lookahead, bound)
                whole = not at_tick and upto >= horizon  # the last arrivals, at it too
                if upto > decided or whole:
                    feeds = sim.routing.decide_until(upto, whole, peers.n, peers.plan.worker)
                    assert sim.feed is not None
                    sim.feed.extend(feeds[0])
                    peers.send_feeds(feeds, math.inf if whole else upto)
                    decided = math.inf if whole else upto
            if target > done or final:
                next_tick = sim.advance(
                    target, inclusive=final, next_tick=next_tick, ticks=False,
                    publish=peers.publish,
                )  # fmt: skip
                done = math.inf if final else target
                peers.publish(done)
                if final or target >= bound:
                    break
            else:
                peers.wait()
        if not at_tick:
            return next_tick
        if not peers.anyone_busy(sim.busy()):
            return next_tick  # nothing left anywhere: the run is over
        sim.tick(next_tick)
        next_tick += sim.tick_s


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
        out.status[ended],
        out.ttft_s[ended],
        out.e2e_s[ended],
        out.region[ended],
        out.gpu[ended],
        out.cached[ended],
        out.violation[ended],
        out.ends[ended],
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


def _child(sim: Simulator, peers: _Peers) -> None:
    """A forked worker: simulate its regions, hand its share to worker 0, exit."""
    code = 1
    try:
        _own(sim, peers.plan.groups[peers.me])
        sim.progress = None
        if sim.feed is not None:
            sim.next_arrival = len(sim.requests)  # worker 0 decides them all
        next_tick = _simulate(sim, peers)
        result = sim.finish(0.0, next_tick)
        peers.send_result(_share_of(sim, result, peers.waited_s))
        code = 0
    except BaseException:  # everything goes to worker 0, then exit
        # Worker 0 may be gone already (it failed first): nothing left to tell then.
        with contextlib.suppress(OSError):
            peers.conns[0].send((_ERROR, traceback.format_exc()))
    finally:
        for conn in peers.conns.values():
            conn.close()
        os._exit(code)


def run_partitioned(sim: Simulator, plan: Plan, started: float) -> RunResult:
    """``sim.run()`` over ``len(plan.groups)`` processes (this one and forked ones)."""
    n = len(plan.groups)
    # Every pair of workers has a pipe; the clocks are shared memory (MAP_SHARED).
    ends: dict[tuple[int, int], Connection] = {}
    for a in range(n):
        for b in range(a + 1, n):
            ends[a, b], ends[b, a] = Pipe(duplex=True)
    shared = mmap.mmap(-1, 8 * STRIDE * (2 * n + n * n))
    clocks = (ctypes.c_double * (STRIDE * 2 * n)).from_buffer(shared)
    counters = (ctypes.c_int64 * (STRIDE * n * n)).from_buffer(shared, 8 * STRIDE * 2 * n)
    pids: list[int] = []
    finished = False
    sys.stdout.flush()
    sys.stderr.flush()
    if sim.routing.GLOBAL_TIER:
        sim.feed = deque()
    mine = {b: ends[0, b] for b in range(1, n)}
    peers = _Peers(0, plan, mine, clocks, counters)
    try:
        for worker in range(1, n):
            pid = os.fork()
            if pid == 0:  # the child: never returns
                theirs = {b: ends[worker, b] for b in range(n) if b != worker}
                for (a, _), conn in ends.items():
                    if a != worker:
                        conn.close()
                child = _Peers(worker, plan, theirs, clocks, counters)
                child.sim = sim
                sim.link = child
                _child(sim, child)
            pids.append(pid)
        for (a, _), conn in ends.items():
            if a != 0:
                conn.close()
        _own(sim, plan.groups[0])
        peers.sim = sim
        sim.link = peers
        next_tick = _simulate(sim, peers)
        result = sim.finish(started, next_tick)
        result.worker_waited_s = (peers.waited_s,)
        for k in range(1, n):
            result = _merge(result, peers._expect(k, _RESULT))
        result.workers = n
        result.wall_s = time.perf_counter() - started
        finished = True
        return result
    finally:
        for conn in mine.values():
            conn.close()
        for pid in pids:
            _reap(pid, stop=not finished)
        sim.link = None
        # The anonymous map (2 × workers doubles) goes with its last reference.


def _reap(pid: int, *, stop: bool) -> None:
    """Wait for a worker's exit; ``stop`` it first (the run failed: it may be waiting
    for an exchange that will never come)."""
    try:
        if stop:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


__all__ = ["Plan", "plan_partition", "run_partitioned"]

"""Soak: ``gtm up --processes`` under a replayed trace for a long time — does anything grow?

Issue 25, item 1. Starts ``gtm up --processes`` (the example topology, or the
``--regions`` it names, on a private 127.x.y.0/24 block and free ports, as the game-day
runner does) and replays the Azure conversation trace through the front door with
``gtm load``'s request builder (:class:`gtmctl.load.LoadRun`) at ``--rate-scale`` × its
rate for ``--duration`` seconds; the trace (about an hour) is replayed again from its
start when the run is longer than it is at that rate. Every ``--interval`` seconds it
samples each process of the deployment (``gtm up`` itself, the front door, the regional
LBs, the zone agents, the emulated GPU workers, etcd):

* **RSS** (``/proc/PID/status``: also its anonymous and file-backed parts) and **open
  descriptors** (``/proc/PID/fd``), by kind: sockets, files (a path), other (pipes,
  event and timer descriptors);
* **tasks** of its event loop (``gtm_event_loop_tasks`` on ``/metrics``);
* **responsiveness**: the round trip of a ``GET /healthz`` (a lagging event loop answers
  late), and the GPU workers' own lag probe (``gtm_gpusim_event_loop_lag_seconds``);
* **log volume**: bytes its log file grew, and its WARNING and ERROR lines;
* the **size gauges** of its caches, indexes and ledgers (every ``gtm_*_entries``
  sample on ``/metrics``), so a structure that grows is named, not guessed.

Printed per process kind: RSS at the end of the warm-up and at the end, the RSS slope
after the warm-up (least squares over the samples, % of the process's RSS per hour;
the kind's worst process and the median) and over the last half of those samples (a
growth that levels off has a flat tail; one that does not keeps its slope), the
descriptors, tasks, responsiveness, log volume per hour, and the size gauges' first and
last values; for the steepest processes, how their growth after the warm-up splits into
steps (a rise of :data:`STEP_KB` or more between two samples: an allocator's high-water
mark at a new peak, such as the longest prompt so far) and a steady rest (a leak, or a
structure filling), and into its anonymous and file-backed parts. Then the errors:
failed requests, restarted children, ERROR lines and ``Traceback`` in the logs, crashed
background tasks (``gtm_task_failures_total``).

Target (``--smoke`` only reports): 0 errors, RSS slope after warm-up below 1 % per
hour for every process, and every process's descriptors back within ``--settle``
seconds after the load: its sockets and other descriptors to their number before the
load, its files to their number at the end of the warm-up (:func:`fds_missed`). A
file a daemon opens once, at its first request of a kind (the audit log at the first
audited decision, an access log), is a step an operator's descriptor alarm never
needs to hear about; a file opened per request, or a connection not closed, is a leak,
and both still show. A short run extrapolates a few minutes of
samples to an hour, so its slopes are noisy (a 1 MB step in a 90 MB process over five
minutes reads as 13 %/h): the figure is the one-hour run.

``--tracemalloc KINDS`` runs every process with ``GTM_TRACEMALLOC_DIR``
(:mod:`gtm.memdebug`: a SIGUSR2 starts allocation tracing and writes a snapshot),
signals the processes of those kinds at the end of the warm-up and at the end of the
load, and prints per kind the source lines whose allocations made in between are
still alive, and per process how the C allocator's and Python's small-object
allocator's figures moved (in use, free inside the heap: fragmentation). Tracing slows
the traced processes down and costs memory of its own: RSS figures of such a run are
not comparable with a plain one. ``--tracemalloc-frames 0`` takes the allocator
figures without tracing (and with them the small-object allocator's, which CPython
does not report while tracing).

    python bench/soak.py                         # 1 h at 1× the trace's rate
    python bench/soak.py --rate-scale 3 --duration 600 --warmup 120
    python bench/soak.py --duration 600 --tracemalloc global,zone
    python bench/soak.py --duration 600 --tracemalloc gpu-sim --tracemalloc-frames 0
    python bench/soak.py --regions us-east,eu-west --rate-scale 0.5 --warmup 1200
    python bench/soak.py --smoke                 # two regions, ~40 s of load (make bench)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from chaos.deployment import Deployment, LaunchSpec
from fleetsim.traces import Trace, TraceKind, TraceRequest, load_trace
from gtm.clock import SystemClock
from gtm.memdebug import DIR_ENV, FRAMES_ENV, MALLOC_SUFFIX, SUFFIX, read_malloc
from gtm.metrics import new_registry
from gtm.state.etcd_server import HISTORY_RETENTION, RAFT_CATCHUP_ENTRIES, SNAPSHOT_ENTRIES
from gtm.tasks import TaskSupervisor
from gtm.topology import load_topology, on_private_block, write_topology
from gtmctl.load import LoadConfig, LoadRun, Tally

ROOT = Path(__file__).resolve().parent.parent
#: RSS slope target: % of the process's RSS per hour.
SLOPE_TARGET_PCT_H = 1.0
#: A rise of RSS between two samples of at least this much is a step (KB): the
#: allocators' high-water mark at a new peak (the longest prompt so far, the most
#: streams at once), not a steady leak, which rises by a little at every sample.
STEP_KB = 256
#: The smoke's regions: the fewest that serve every client of the trace (the example
#: policy keeps GDPR clients in the EEA; with us-east alone they are refused).
SMOKE_REGIONS = "us-east,eu-west"
#: Order of the kinds in the tables.
KINDS = ("gtm up", "global", "regional", "zone", "gpu-sim", "etcd", "chaos-proxy")
#: A /metrics or /healthz answer slower than this counts as no answer (s).
PROBE_TIMEOUT_S = 5.0
#: Log lines that count as errors.
ERROR_MARKS = (
    "level=ERROR", "level=CRITICAL", "Traceback (most recent call last)",
    '"level":"error"', '"level":"fatal"', '"level":"panic"',  # etcd's JSON lines
)  # fmt: skip
WARNING_MARKS = ("level=WARNING", '"level":"warn"')
#: etcd's own size figures, read from its /metrics with the ``gtm_*_entries`` gauges:
#: its raft index (the in-memory raft log holds the last 5,000 entries plus up to
#: ``--snapshot-count`` more, so it fills until the index passes their sum), its
#: database, its keys and its Go heap.
ETCD_DB_SIZE = "etcd_mvcc_db_total_size_in_bytes"
ETCD_SIZES = (
    "etcd_server_proposals_committed_total",
    ETCD_DB_SIZE,
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_debugging_mvcc_keys_total",
    "go_memstats_heap_inuse_bytes",
)
#: The other samples the soak reads from a /metrics page.
READ_BY_NAME = frozenset(
    (
        "gtm_event_loop_tasks",
        "gtm_task_failures_total",
        "gtm_gpusim_event_loop_lag_seconds_sum",
        "gtm_gpusim_event_loop_lag_seconds_count",
        *ETCD_SIZES,
    )
)


# ---------------------------------------------------------------------------- arithmetic


def slope_pct_per_hour(times_s: Sequence[float], rss: Sequence[float]) -> float:
    """The least-squares slope of ``rss`` over ``times_s``, as % of the mean RSS per
    hour (NaN with fewer than three samples or no spread in time)."""
    if len(times_s) < 3 or max(times_s) - min(times_s) <= 0:
        return math.nan
    slope_per_s = float(np.polyfit(np.asarray(times_s), np.asarray(rss, dtype=float), 1)[0])
    mean = float(np.mean(rss))
    return math.nan if mean <= 0 else 100.0 * slope_per_s * 3600.0 / mean


def looped(trace: Trace, duration_s: float, rate_scale: float) -> tuple[TraceRequest, ...]:
    """The requests arriving in ``duration_s`` at ``rate_scale`` × the trace's rate,
    the trace replayed from its start (shifted by its length) as often as it takes."""
    limit = duration_s * rate_scale
    span = trace.duration_s + 1.0 / max(trace.rate_per_s, 1e-9)  # one gap between laps
    out: list[TraceRequest] = []
    lap = 0
    while lap * span < limit:
        offset = lap * span
        for r in trace.requests:
            at = r.at_s + offset
            if at >= limit:
                break
            out.append(dataclasses.replace(r, at_s=at))
        lap += 1
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Growth:
    """How a process's RSS grew over samples: in steps (rises of at least
    :data:`STEP_KB` between two samples) and the rest (a steady creep, and falls)."""

    total_kb: int
    #: (when, KB) of every step, in time order.
    steps: tuple[tuple[float, int], ...]

    @property
    def in_steps_kb(self) -> int:
        return sum(kb for _, kb in self.steps)

    @property
    def rest_kb(self) -> int:
        return self.total_kb - self.in_steps_kb

    def __str__(self) -> str:
        text = f"{self.total_kb:+d} KB: {self.rest_kb:+d} steady"
        if self.steps:
            at, kb = max(self.steps, key=lambda step: step[1])
            text += f", {self.in_steps_kb:+d} in {len(self.steps)} step(s)"
            text += f" (largest +{kb} at {at:.0f} s)"
        return text


def growth(times_s: Sequence[float], rss_kb: Sequence[int], step_kb: int = STEP_KB) -> Growth:
    """The growth from the first sample to the last, split into steps and the rest."""
    if not rss_kb:
        return Growth(0, ())
    steps = tuple(
        (t, b - a)
        for t, a, b in zip(times_s[1:], rss_kb, rss_kb[1:], strict=False)
        if b - a >= step_kb
    )
    return Growth(rss_kb[-1] - rss_kb[0], steps)


# ---------------------------------------------------------------------------- samples


@dataclass(frozen=True, slots=True)
class Proc:
    """One process of the deployment."""

    name: str  # control name ("zone/us-east-a"), "gtm up", or "etcd/<member>"
    kind: str
    pid: int
    #: Where its /metrics and /healthz answer (None: not an HTTP service of ours).
    url: str | None
    log: Path | None


class FdKind(StrEnum):
    """What an open descriptor is, from its ``/proc/PID/fd`` link."""

    SOCKET = "socket"  # socket:[inode]: a connection or a listener
    FILE = "file"  # a path: logs, the audit chain, etcd's WAL and database, /dev/null
    OTHER = "other"  # pipe:[…], anon_inode:[eventpoll|eventfd|timerfd|…]


def fd_kind(target: str) -> FdKind:
    if target.startswith("socket:"):
        return FdKind.SOCKET
    if target.startswith("/"):
        return FdKind.FILE
    return FdKind.OTHER


@dataclass(frozen=True, slots=True)
class Fds:
    """A process's open descriptors, by kind."""

    sockets: int = 0
    files: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.sockets + self.files + self.other

    @classmethod
    def of(cls, targets: Iterable[str]) -> Fds:
        counted = Counter(fd_kind(t) for t in targets)
        return cls(counted[FdKind.SOCKET], counted[FdKind.FILE], counted[FdKind.OTHER])

    def __str__(self) -> str:
        return f"{self.sockets} sockets, {self.files} files, {self.other} other"


def fds_missed(before: Fds, warm: Fds | None, after: Fds) -> str | None:
    """How ``after`` (once the load is over) is not back, or None. Sockets and other
    descriptors come back to ``before`` (the load's start); files to ``warm`` (the end
    of the warm-up, or ``before`` without one): a file opened once at a first request
    (the audit log) stays open by design, one opened per request or never closed does
    not come back to it."""
    files_base = max(before.files, warm.files) if warm is not None else before.files
    missed = []
    if after.sockets > before.sockets:
        missed.append(f"{after.sockets} sockets after the load, {before.sockets} before")
    if after.other > before.other:
        missed.append(f"{after.other} other descriptors after the load, {before.other} before")
    if after.files > files_base:
        missed.append(f"{after.files} files after the load, {files_base} after the warm-up")
    return "; ".join(missed) or None


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float  # since the load started (negative: before)
    rss_kb: int
    fds: int
    tasks: float | None = None
    healthz_s: float | None = None
    lag_sum_s: float | None = None
    lag_count: float | None = None
    task_failures: float | None = None
    #: Every ``gtm_*_entries`` sample: "name{labels}" → value.
    entries: Mapping[str, float] = field(default_factory=dict)
    #: RSS's anonymous part (heap, stacks) and file-backed part (code, mmapped files:
    #: etcd's database).
    rss_anon_kb: int | None = None
    rss_file_kb: int | None = None


@dataclass(slots=True)
class Series:
    proc: Proc
    samples: list[Sample] = field(default_factory=list)
    log_offset: int = 0
    log_bytes_after_warmup: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: int = 0


def read_rss_kb(pid: int) -> int | None:
    return read_memory_kb(pid).get("VmRSS")


def read_memory_kb(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile of ``/proc/PID/status`` (empty: the process is gone)."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    except OSError:
        return {}
    return out


def read_fds(pid: int) -> Fds | None:
    """The process's descriptors by kind (None: it is gone). A descriptor closed while
    it is read is not counted."""
    directory = f"/proc/{pid}/fd"
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    targets = []
    for name in names:
        with contextlib.suppress(OSError):
            targets.append(os.readlink(f"{directory}/{name}"))
    return Fds.of(targets)


def count_fds(pid: int) -> int | None:
    fds = read_fds(pid)
    return None if fds is None else fds.total


def metric_values(text: str) -> dict[str, float]:
    """The samples of a /metrics page the soak reads: "name{a="b"}" → value."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            wanted = s.name.endswith("_entries") or s.name in READ_BY_NAME
            if wanted:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _sum(values: Mapping[str, float], name: str) -> float | None:
    found = [v for k, v in values.items() if k == name or k.startswith(name + "{")]
    return sum(found) if found else None


async def probe(
    session: aiohttp.ClientSession, proc: Proc
) -> tuple[float | None, dict[str, float]]:
    """(/healthz round trip, /metrics samples) of one process (None, {}: no answer)."""
    if proc.url is None:
        return None, {}
    healthz: float | None = None
    values: dict[str, float] = {}
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        started = time.monotonic()
        async with session.get(f"{proc.url}/healthz") as response:
            await response.read()
            if response.status == 200:
                healthz = time.monotonic() - started
        async with session.get(f"{proc.url}/metrics") as response:
            if response.status == 200:
                values = metric_values(await response.text())
    return healthz, values


def scan_log(series: Series, counting: bool) -> None:
    """Read what the process's log gained since the last scan: its ERROR lines and
    tracebacks (errors), WARNING lines, and (``counting``: after the warm-up) bytes."""
    path = series.proc.log
    if path is None:
        return
    try:
        with path.open("rb") as handle:
            handle.seek(series.log_offset)
            chunk = handle.read()
    except OSError:
        return
    # Only whole lines; the rest is read next time.
    end = chunk.rfind(b"\n") + 1
    series.log_offset += end
    if counting:
        series.log_bytes_after_warmup += end
    for line in chunk[:end].decode("utf-8", errors="replace").splitlines():
        if any(mark in line for mark in ERROR_MARKS):
            series.errors.append(line.strip()[:300])
        elif any(mark in line for mark in WARNING_MARKS):
            series.warnings += 1


# ---------------------------------------------------------------------------- the deployment


def private_topology(directory: Path, regions: str | None) -> Path:
    """The example topology (or the ``regions`` it names: ids, comma-separated, or a
    count of its first regions) on a random 127.x.y.0/24 block with a random zone-port
    base (:func:`gtm.topology.on_private_block`)."""
    example = load_topology()
    kept = example.regions
    if regions and regions.isdigit():
        kept = kept[: int(regions)]
    elif regions:
        wanted = regions.split(",")
        unknown = set(wanted) - {r.id for r in kept}
        if unknown:
            raise SystemExit(f"--regions: no region {', '.join(sorted(unknown))} in the example")
        kept = tuple(r for r in kept if r.id in wanted)
    moved = on_private_block(example.model_copy(update={"regions": kept}), random.Random())
    path = write_topology(moved, directory / "topology.yaml")
    return path


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def processes(deployment: Deployment, up_pid: int) -> list[Proc]:
    """Every process of the deployment as of its control API's last answer."""
    doc = deployment.document
    run_dir = Path(doc.run_dir)
    urls: dict[str, str | None] = {"global": doc.front_door_url}
    urls |= {f"regional/{r.name}": r.url for r in doc.regions}
    urls |= {f"zone/{z.name}": z.url for z in doc.zones}
    urls |= {f"gpu/{g.name}": g.url for g in doc.gpus}
    found = [Proc("gtm up", "gtm up", up_pid, None, run_dir / "gtm-up.stderr")]
    for child in doc.children:
        if child.pid is None:
            continue
        short = child.name.split("/", 1)[-1]
        log = run_dir / "logs" / f"{child.kind}-{short}.log"
        found.append(Proc(child.name, child.kind, child.pid, urls.get(child.name), log))
    for member in doc.etcd:
        if member.pid is not None:
            logs = sorted(run_dir.glob(f"**/{member.name}.log"))
            # Its client URL answers /metrics (and 404 to /healthz: no round trip).
            url = member.client_url
            found.append(
                Proc(f"etcd/{member.name}", "etcd", member.pid, url, logs[0] if logs else None)
            )
    return found


def up_pid_of(deployment: Deployment) -> int:
    """``gtm up``'s own pid: the parent of its children."""
    child = next(c.pid for c in deployment.document.children if c.pid is not None)
    stat = Path(f"/proc/{child}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


# ---------------------------------------------------------------------------- the run


@dataclass(slots=True)
class Run:
    series: dict[str, Series] = field(default_factory=dict)
    fds_before: dict[str, Fds] = field(default_factory=dict)
    #: At the first sample after the warm-up.
    fds_warm: dict[str, Fds] = field(default_factory=dict)
    fds_after: dict[str, Fds] = field(default_factory=dict)
    fds_settled_s: float | None = None
    #: Per process: the allocator figures (gtm.memdebug.read_malloc) at the two snapshots.
    malloc: dict[str, tuple[dict[str, int], dict[str, int]]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    tally: Tally | None = None
    load_s: float = 0.0
    requests: int = 0
    snapshots: dict[str, tuple[Path, Path]] = field(default_factory=dict)


def descriptors_missed(run: Run) -> dict[str, str]:
    """Every process whose descriptors are not back (:func:`fds_missed`): why."""
    missed = {}
    for name, before in run.fds_before.items():
        after = run.fds_after.get(name)
        why = None if after is None else fds_missed(before, run.fds_warm.get(name), after)
        if why is not None:
            missed[name] = why
    return missed


class Sampler:
    def __init__(
        self, deployment: Deployment, run: Run, up_pid: int, warmup_s: float, interval_s: float
    ) -> None:
        self._deployment = deployment
        self._run = run
        self._up_pid = up_pid
        self._warmup = warmup_s
        self._interval = interval_s
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
            connector=aiohttp.TCPConnector(force_close=True),  # holds no descriptor of theirs
        )
        self.load_started: float | None = None

    async def aclose(self) -> None:
        await self._session.close()

    def at(self) -> float:
        return 0.0 if self.load_started is None else time.monotonic() - self.load_started

    async def sample(self) -> None:
        await self._deployment.refresh()
        procs = processes(self._deployment, self._up_pid)
        at = self.at()
        counting = self.load_started is not None and at >= self._warmup
        results = await asyncio.gather(*(probe(self._session, p) for p in procs))
        for proc, (healthz, values) in zip(procs, results, strict=True):
            series = self._run.series.get(proc.name)
            if series is None or series.proc.pid != proc.pid:
                # New, or restarted (a restart is counted from the control API): the
                # series starts over, its log is read from where it is now.
                offset = series.log_offset if series is not None else 0
                series = self._run.series[proc.name] = Series(proc, log_offset=offset)
            memory, fds = read_memory_kb(proc.pid), read_fds(proc.pid)
            if "VmRSS" not in memory or fds is None:
                continue
            if counting:
                self._run.fds_warm.setdefault(proc.name, fds)
            series.samples.append(
                Sample(
                    at, memory["VmRSS"], fds.total, _sum(values, "gtm_event_loop_tasks"),
                    healthz, _sum(values, "gtm_gpusim_event_loop_lag_seconds_sum"),
                    _sum(values, "gtm_gpusim_event_loop_lag_seconds_count"),
                    _sum(values, "gtm_task_failures_total"),
                    {k: v for k, v in values.items() if "_entries" in k or k in ETCD_SIZES},
                    memory.get("RssAnon"), memory.get("RssFile"),
                )
            )  # fmt: skip
            scan_log(series, counting)
        doc = self._deployment.document
        self._run.restarts = {c.name: c.restarts for c in doc.children if c.restarts} | {
            f"etcd/{m.name}": m.restarts for m in doc.etcd if m.restarts
        }

    def fds(self) -> dict[str, Fds]:
        return {
            name: n
            for name, s in self._run.series.items()
            if (n := read_fds(s.proc.pid)) is not None
        }

    def snapshot(self, kinds: Sequence[str]) -> None:
        """SIGUSR2 to the gtm processes of ``kinds``: each writes its next allocation
        snapshot (the first signal starts tracing)."""
        for series in self._run.series.values():
            if series.proc.kind in kinds:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(series.proc.pid, signal.SIGUSR2)

    def progress(self, tally: Tally | None, duration_s: float) -> str:
        by_kind: dict[str, int] = defaultdict(int)
        for s in self._run.series.values():
            if s.samples:
                by_kind[s.proc.kind] += s.samples[-1].rss_kb
        total = sum(by_kind.values())
        load = ""
        if tally is not None:
            failed = tally.done - tally.succeeded
            load = f"  sent {tally.sent}/{tally.scheduled} ok {tally.succeeded} failed {failed}"
        kinds = " ".join(f"{k} {by_kind[k] / 1024:.0f}" for k in KINDS if k in by_kind)
        return f"[{self.at():6.0f}/{duration_s:.0f} s]{load}  RSS MB {total / 1024:.0f} ({kinds})"


async def sample_loop(sampler: Sampler, run: Run, duration_s: float, every_s: float) -> None:
    while True:
        started = time.monotonic()
        await sampler.sample()
        print(sampler.progress(run.tally, duration_s), file=sys.stderr, flush=True)
        await asyncio.sleep(max(0.0, every_s - (time.monotonic() - started)))


async def wait_snapshots(
    directory: Path, pids: Iterable[int], n: int, limit_s: float, suffix: str = SUFFIX
) -> None:
    """Until every process wrote its n-th snapshot (a file appears: polled), or the limit."""
    deadline = time.monotonic() + limit_s
    wanted = {directory / f"{pid}-{n}{suffix}" for pid in pids}
    for _ in range(int(limit_s / 0.5) + 1):
        if time.monotonic() >= deadline or all(p.exists() for p in wanted):
            return
        await asyncio.sleep(0.5)


async def soak(args: argparse.Namespace, work: Path) -> Run:
    # SIGTERM (or SIGINT, which a background shell ignores) stops the run cleanly: the
    # deployment runs in a session of its own and would outlive this process.
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    run = Run()
    trace = load_trace(TraceKind(args.trace))
    requests = looped(trace, args.duration, args.rate_scale)
    run.requests = len(requests)
    snap_dir = work / "tracemalloc"
    traced = tuple(k for k in (args.tracemalloc or "").split(",") if k)
    env: tuple[tuple[str, str], ...] = ((DIR_ENV, str(snap_dir)),) if args.tracemalloc else ()
    if args.tracemalloc and args.tracemalloc_frames is not None:
        env += ((FRAMES_ENV, str(args.tracemalloc_frames)),)
    # Without tracing a process writes only its allocator figures (gtm.memdebug).
    last_file = MALLOC_SUFFIX if args.tracemalloc_frames == 0 else SUFFIX
    spec = LaunchSpec(
        topology=private_topology(work, args.regions),
        speedup=args.speedup,
        run_dir=work / "run",
        env=env,
        ready_timeout_s=180.0,
    )
    print(
        f"soak: {trace.kind.value} × {args.rate_scale:g} ({trace.rate_per_s * args.rate_scale:.2f}"
        f" req/s) for {args.duration:g} s = {len(requests)} requests, warm-up {args.warmup:g} s,"
        f" sample every {args.interval:g} s; gtm up --processes, "
        f"regions {args.regions or 'all'}, speedup {args.speedup:g}",
        flush=True,
    )
    async with Deployment.launch(spec) as deployment:
        up_pid = up_pid_of(deployment)
        sampler = Sampler(deployment, run, up_pid, args.warmup, args.interval)
        try:
            await sampler.sample()
            await asyncio.sleep(args.interval)
            await sampler.sample()
            run.fds_before = sampler.fds()
            config = LoadConfig(
                url=deployment.front_door_url,
                rate_scale=args.rate_scale,
                duration_s=args.duration,
                seed=args.seed,
                max_input_tokens=args.max_input_tokens,
                max_output_tokens=args.max_output_tokens,
                timeout_s=args.request_timeout,
            )
            load = LoadRun(config, requests, clock=SystemClock())
            run.tally = load.tally
            sampler.load_started = time.monotonic()
            supervisor = TaskSupervisor(registry=new_registry(), component="soak")
            supervisor.spawn("sample", sample_loop(sampler, run, args.duration, args.interval))
            snapping = None
            if args.tracemalloc:
                snapping = supervisor.spawn("snapshot", _snap_at(sampler, args.warmup, traced))
            try:
                await load.run()
                run.load_s = sampler.at()
                if snapping is not None:
                    await snapping
            finally:
                await supervisor.aclose()
            await sampler.sample()
            if snapping is not None:
                sampler.snapshot(traced)
                pids = [s.proc.pid for s in run.series.values() if s.proc.kind in traced]
                await wait_snapshots(snap_dir, pids, 2, 120.0, last_file)
                for name, s in run.series.items():
                    first = snap_dir / f"{s.proc.pid}-1{SUFFIX}"
                    second = snap_dir / f"{s.proc.pid}-2{SUFFIX}"
                    if first.exists() and second.exists():
                        run.snapshots[name] = (first, second)
                    figures = [snap_dir / f"{s.proc.pid}-{n}{MALLOC_SUFFIX}" for n in (1, 2)]
                    if all(f.exists() for f in figures):
                        run.malloc[name] = (read_malloc(figures[0]), read_malloc(figures[1]))
            # Descriptors back to their level before the load: wait up to --settle.
            settle_started = time.monotonic()
            while True:
                run.fds_after = sampler.fds()
                if not descriptors_missed(run):
                    run.fds_settled_s = time.monotonic() - settle_started
                    break
                if time.monotonic() - settle_started >= args.settle:
                    break
                await asyncio.sleep(1.0)
            await sampler.sample()
        finally:
            await sampler.aclose()
    return run


async def _snap_at(sampler: Sampler, at_s: float, kinds: Sequence[str]) -> None:
    await asyncio.sleep(max(0.0, at_s - sampler.at()))
    sampler.snapshot(kinds)


# ---------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class ProcFigures:
    name: str
    kind: str
    rss_warm_mb: float
    rss_end_mb: float
    slope_pct_h: float
    #: The slope over the last half of the samples after the warm-up.
    slope_tail_pct_h: float
    fds_before: Fds | None
    fds_warm: Fds | None
    fds_after: Fds | None
    tasks_first: float | None
    tasks_last: float | None
    tasks_max: float | None
    healthz_p99_ms: float | None
    lag_mean_ms: float | None
    log_kb_per_h: float
    warnings: int
    errors: int
    #: RSS growth after the warm-up, in steps and the rest; and that of its anonymous
    #: (heap) and file-backed (code, mapped files) parts, KB.
    growth: Growth = Growth(0, ())
    anon_kb: int | None = None
    file_kb: int | None = None


def _load_samples(series: Series) -> list[Sample]:
    return [s for s in series.samples if s.at_s >= 0]


def proc_figures(run: Run, warmup_s: float) -> list[ProcFigures]:
    out = []
    for name, series in run.series.items():
        during = _load_samples(series)
        warm = [s for s in during if s.at_s >= warmup_s]
        if not warm:
            continue
        hours = max(1e-9, (warm[-1].at_s - warm[0].at_s) / 3600.0)
        tail = [s for s in warm if s.at_s >= (warm[0].at_s + warm[-1].at_s) / 2]
        tasks = [s.tasks for s in during if s.tasks is not None]
        healthz = sorted(1000 * s.healthz_s for s in during if s.healthz_s is not None)
        lag = [s for s in warm if s.lag_sum_s is not None and s.lag_count]
        lag_ms = None
        if len(lag) >= 2 and (lag[-1].lag_count or 0) > (lag[0].lag_count or 0):
            lag_ms = (
                1000
                * ((lag[-1].lag_sum_s or 0) - (lag[0].lag_sum_s or 0))
                / ((lag[-1].lag_count or 0) - (lag[0].lag_count or 0))
            )
        out.append(
            ProcFigures(
                name, series.proc.kind, warm[0].rss_kb / 1024, warm[-1].rss_kb / 1024,
                slope_pct_per_hour([s.at_s for s in warm], [s.rss_kb for s in warm]),
                slope_pct_per_hour([s.at_s for s in tail], [s.rss_kb for s in tail]),
                run.fds_before.get(name), run.fds_warm.get(name), run.fds_after.get(name),
                tasks[0] if tasks else None, tasks[-1] if tasks else None,
                max(tasks) if tasks else None,
                healthz[min(len(healthz) - 1, int(0.99 * len(healthz)))] if healthz else None,
                lag_ms, series.log_bytes_after_warmup / 1024 / hours, series.warnings,
                len(series.errors), growth([s.at_s for s in warm], [s.rss_kb for s in warm]),
                _delta(warm[0].rss_anon_kb, warm[-1].rss_anon_kb),
                _delta(warm[0].rss_file_kb, warm[-1].rss_file_kb),
            )
        )  # fmt: skip
    return out


def _delta(first: int | None, last: int | None) -> int | None:
    return None if first is None or last is None else last - first


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{value:{spec}}")
    )


def _worst_median(slopes: Iterable[float]) -> tuple[float, float]:
    known = [v for v in slopes if not math.isnan(v)]
    if not known:
        return math.nan, math.nan
    return max(known, key=abs), statistics.median(known)


def kind_table(figures: Sequence[ProcFigures]) -> list[str]:
    rows = [
        "| kind | n | RSS MB after warm-up → end (sum) | slope %/h worst (median) | "
        "last half: worst (median) | sockets before → after load | files after warm-up → "
        "after load | tasks first → last (max) | /healthz p99 ms | "
        "GPU lag probe mean ms | log KB/h | warnings | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_kind: dict[str, list[ProcFigures]] = defaultdict(list)
    for f in figures:
        by_kind[f.kind].append(f)
    for kind in sorted(by_kind, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
        group = by_kind[kind]
        worst, median = _worst_median(f.slope_pct_h for f in group)
        tail_worst, tail_median = _worst_median(f.slope_tail_pct_h for f in group)

        def total(values: Iterable[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return sum(known) if known else None

        lags = [f.lag_mean_ms for f in group if f.lag_mean_ms is not None]
        healthz = [f.healthz_p99_ms for f in group if f.healthz_p99_ms is not None]
        rows.append(
            f"| {kind} | {len(group)} | {sum(f.rss_warm_mb for f in group):.0f} → "
            f"{sum(f.rss_end_mb for f in group):.0f} | {_fmt(worst, '+.2f')} "
            f"({_fmt(median, '+.2f')}) | {_fmt(tail_worst, '+.2f')} "
            f"({_fmt(tail_median, '+.2f')}) | "
            f"{_fmt(total(f.fds_before.sockets if f.fds_before else None for f in group))} → "
            f"{_fmt(total(f.fds_after.sockets if f.fds_after else None for f in group))} | "
            f"{_fmt(total(f.fds_warm.files if f.fds_warm else None for f in group))} → "
            f"{_fmt(total(f.fds_after.files if f.fds_after else None for f in group))} | "
            f"{_fmt(total(f.tasks_first for f in group))} → "
            f"{_fmt(total(f.tasks_last for f in group))} "
            f"({_fmt(total(f.tasks_max for f in group))}) | "
            f"{_fmt(max(healthz) if healthz else None)} | "
            f"{_fmt(statistics.mean(lags) if lags else None, '.1f')} | "
            f"{sum(f.log_kb_per_h for f in group):.0f} | {sum(f.warnings for f in group)} | "
            f"{sum(f.errors for f in group)} |"
        )
    return rows


def entries_table(run: Run, warmup_s: float) -> list[str]:
    """Each size gauge, summed over the processes of a kind: after the warm-up → end."""
    first: dict[tuple[str, str], float] = defaultdict(float)
    last: dict[tuple[str, str], float] = defaultdict(float)
    peak: dict[tuple[str, str], float] = defaultdict(float)
    for series in run.series.values():
        warm = [s for s in _load_samples(series) if s.at_s >= warmup_s]
        if not warm:
            continue
        for name in set(warm[0].entries) | set(warm[-1].entries):
            gauge = name.split("{", 1)[0]
            key = (series.proc.kind, gauge)
            first[key] += warm[0].entries.get(name, 0.0)
            last[key] += warm[-1].entries.get(name, 0.0)
            peak[key] += max(s.entries.get(name, 0.0) for s in warm)
    if not first and not last:
        return ["(no gtm_*_entries gauges exported)"]
    rows = ["| kind | size gauge (sum over processes) | after warm-up | end | peak |",
            "|---|---|---:|---:|---:|"]  # fmt: skip
    for key in sorted(set(first) | set(last)):
        rows.append(
            f"| {key[0]} | {key[1]} | {first[key]:.0f} | {last[key]:.0f} | {peak[key]:.0f} |"
        )
    return rows


def etcd_notes(run: Run, warmup_s: float) -> list[str]:
    """Per etcd member: its raft index at the end of the warm-up against the entries
    its in-memory raft log fills to (:data:`RAFT_CATCHUP_ENTRIES` +
    :data:`SNAPSHOT_ENTRIES`), and its slope from when the index passed them; and its
    database's size over the fit, which grows for about two compaction periods
    (:data:`gtm.state.etcd_server.HISTORY_RETENTION`) and with it the file-backed part
    of etcd's RSS (the database is mapped)."""
    full = RAFT_CATCHUP_ENTRIES + SNAPSHOT_ENTRIES
    notes = []
    for name, series in sorted(run.series.items()):
        warm = [s for s in _load_samples(series) if s.at_s >= warmup_s]
        index = [(s, s.entries.get(ETCD_SIZES[0])) for s in warm]
        known = [(s, i) for s, i in index if i is not None]
        if series.proc.kind != "etcd" or not known:
            continue
        first = known[0][1]
        filled = [s for s, i in known if i >= full]
        slope = slope_pct_per_hour([s.at_s for s in filled], [s.rss_kb for s in filled])
        state = (
            "full from the start of the fit"
            if first >= full
            else f"still filling after the warm-up (a longer --warmup covers it); "
            f"slope once full: {_fmt(slope, '+.2f')} %/h over {len(filled)} samples"
        )
        db = [v for s in warm if (v := s.entries.get(ETCD_DB_SIZE)) is not None]
        database = (
            f"; its database {db[0] / 2**20:.1f} → {db[-1] / 2**20:.1f} MB over the fit "
            f"(it grows for about two compaction periods of {HISTORY_RETENTION}, then levels off)"
            if db
            else ""
        )
        notes.append(
            f"{name}: raft index {first:.0f} at the end of the warm-up, "
            f"{known[-1][1]:.0f} at the end; its in-memory raft log fills to {full} "
            f"entries: {state}{database}"
        )
    return notes


def errors(run: Run) -> list[str]:
    found: list[str] = []
    tally = run.tally
    if tally is not None:
        failed = Counter(o.reason for o in tally.outcomes if not o.ok)
        if failed:
            found.append(
                f"{sum(failed.values())} failed requests: "
                + ", ".join(f"{k} {n}" for k, n in failed.most_common())
            )
        if tally.done < run.requests:
            found.append(f"{run.requests - tally.done} requests never finished")
    for name, n in sorted(run.restarts.items()):
        found.append(f"{name} restarted {n} time(s)")
    for name, series in sorted(run.series.items()):
        crashes = [s.task_failures for s in series.samples if s.task_failures is not None]
        if len(crashes) >= 2 and crashes[-1] > crashes[0]:
            found.append(f"{name}: {crashes[-1] - crashes[0]:.0f} background task failure(s)")
        for line in series.errors[:3]:
            found.append(f"{name}: {line}")
        if len(series.errors) > 3:
            found.append(f"{name}: … {len(series.errors) - 3} more error lines")
    return found


def verdict(figures: Sequence[ProcFigures], run: Run, errs: Sequence[str]) -> list[str]:
    """What misses the target (empty: met)."""
    missed = list(errs)
    for f in figures:
        if not math.isnan(f.slope_pct_h) and f.slope_pct_h >= SLOPE_TARGET_PCT_H:
            missed.append(f"{f.name}: RSS slope {f.slope_pct_h:+.2f} %/h ≥ {SLOPE_TARGET_PCT_H}")
    for name, why in descriptors_missed(run).items():
        missed.append(f"{name}: {why}")
    return missed


def heap_growth(run: Run, top: int = 8) -> list[str]:
    """Per kind, the source lines whose traced allocations grew most (summed over the
    kind's processes) between the two snapshots."""
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for name, (first, second) in run.snapshots.items():
        kind = run.series[name].proc.kind
        a = tracemalloc.Snapshot.load(str(first))
        b = tracemalloc.Snapshot.load(str(second))
        for stat in b.compare_to(a, "traceback"):
            # Innermost frame (where the block was allocated) first, then its callers.
            frames = [f"{_short(fr.filename)}:{fr.lineno}" for fr in reversed(stat.traceback)]
            key = " < ".join(frames[:5])
            by_kind[kind][key] += stat.size_diff
            counts[kind][key] += stat.count_diff
    lines = []
    for kind in sorted(by_kind):
        n = sum(1 for name in run.snapshots if run.series[name].proc.kind == kind)
        lines.append(f"{kind} (summed over {n} processes):")
        for key, size in by_kind[kind].most_common(top):
            if size <= 0:
                break
            lines.append(f"  {size / 1024:+9.0f} KB {counts[kind][key]:+7d} blocks  {key}")
    return lines


#: The allocator figures compared between the snapshots: (title, gtm.memdebug key).
ALLOCATOR_FIGURES = (
    ("malloc in use", "mallinfo2.uordblks"),
    ("malloc free in heap", "mallinfo2.fordblks"),
    ("malloc mmapped", "mallinfo2.hblkhd"),
    ("pymalloc used", "pymalloc.bytes_in_allocated_blocks"),
    ("pymalloc free", "pymalloc.bytes_in_available_blocks"),
    ("traced", "tracemalloc.current"),
)


def allocator_table(run: Run, warmup_s: float) -> list[str]:
    """Per process, how RSS and the allocators' figures moved between the two
    snapshots (KB): live memory flat while "free in heap" or pymalloc's free blocks
    grow is fragmentation, not a leak."""
    rows = [
        "allocator figures between the snapshots, KB (gtm.memdebug):",
        "| process | RSS | " + " | ".join(t for t, _ in ALLOCATOR_FIGURES) + " | pymalloc arenas |",
        "|---|" + "---:|" * (len(ALLOCATOR_FIGURES) + 2),
    ]
    for name, (first, second) in sorted(run.malloc.items()):
        warm = [s for s in _load_samples(run.series[name]) if s.at_s >= warmup_s]
        rss = warm[-1].rss_kb - warm[0].rss_kb if warm else None
        cells = [
            _fmt((second[key] - first[key]) / 1024, "+.0f")
            if key in first and key in second
            else "–"
            for _, key in ALLOCATOR_FIGURES
        ]
        arenas = "pymalloc.arenas_allocated_current"
        cells.append(f"{first.get(arenas, '–')} → {second.get(arenas, '–')}")
        rows.append(f"| {name} | {_fmt(rss, '+.0f')} | " + " | ".join(cells) + " |")
    return rows


def _short(filename: str) -> str:
    for marker in ("site-packages/", str(ROOT) + "/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def plot(run: Run, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    by_kind: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for series in run.series.values():
        for s in _load_samples(series):
            by_kind[series.proc.kind][round(s.at_s)] += s.rss_kb / 1024
    fig, ax = plt.subplots(figsize=(9, 5))
    for kind, points in sorted(by_kind.items()):
        xs = sorted(points)
        ax.plot([x / 60 for x in xs], [points[x] for x in xs], label=kind)
    ax.set_xlabel("minutes since the load started")
    ax.set_ylabel("RSS MB, summed over the kind's processes")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_series(run: Run, path: Path) -> None:
    rows = ["process,kind,pid,at_s,rss_kb,fds,tasks,healthz_ms,rss_anon_kb,rss_file_kb"]
    for name, series in run.series.items():
        for s in series.samples:
            rows.append(
                f"{name},{series.proc.kind},{series.proc.pid},{s.at_s:.1f},{s.rss_kb},{s.fds},"
                f"{_fmt(s.tasks)},"
                f"{_fmt(None if s.healthz_s is None else 1000 * s.healthz_s, '.1f')},"
                f"{_fmt(s.rss_anon_kb)},{_fmt(s.rss_file_kb)}"
            )
    path.write_text("\n".join(rows) + "\n", "utf-8")


def report(args: argparse.Namespace, run: Run) -> tuple[str, list[str]]:
    figures = proc_figures(run, args.warmup)
    errs = errors(run)
    missed = verdict(figures, run, errs)
    tally = run.tally
    summary = tally.summary() if tally is not None else {}
    lines = [
        f"load: {summary.get('requests', 0)} of {run.requests} requests done in "
        f"{run.load_s:.0f} s, {summary.get('succeeded', 0)} succeeded; TTFT p50 "
        f"{_fmt((summary.get('ttft_ms') or {}).get('p50'))} ms, p99 "
        f"{_fmt((summary.get('ttft_ms') or {}).get('p99'))} ms; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        f"RSS slope fitted over the samples after the {args.warmup:g} s warm-up, and over "
        f"their last half; sockets before the load, files at the end of the warm-up, both "
        f"{_fmt(run.fds_settled_s)} s after the load (limit {args.settle:g} s)",
        "",
        *kind_table(figures),
        "",
        *entries_table(run, args.warmup),
        *etcd_notes(run, args.warmup),
        "",
        "errors: " + ("none" if not errs else ""),
        *(f"  {e}" for e in errs),
    ]
    worst = sorted(
        (f for f in figures if not math.isnan(f.slope_pct_h)), key=lambda f: -f.slope_pct_h
    )[:5]
    lines.append(
        "steepest processes: "
        + ", ".join(
            f"{f.name} {f.slope_pct_h:+.2f} %/h, last half {_fmt(f.slope_tail_pct_h, '+.2f')} "
            f"({f.rss_end_mb:.0f} MB)"
            for f in worst
        )
    )
    lines.append(
        f"their RSS after the warm-up (a step: +{STEP_KB} KB or more between two samples, "
        "a new peak's high-water mark; steady: the rest):"
    )
    lines += [
        f"  {f.name}: {f.growth}; anonymous {_fmt(f.anon_kb, '+.0f')} KB, "
        f"file-backed {_fmt(f.file_kb, '+.0f')} KB"
        for f in worst
    ]
    if run.malloc:
        lines += ["", *allocator_table(run, args.warmup)]
    if run.snapshots:
        lines += ["", "allocation growth between the snapshots (tracemalloc):", *heap_growth(run)]
    return "\n".join(lines), missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="two regions, ~40 s of load; reports, never fails")  # fmt: skip
    parser.add_argument("--duration", type=float, default=3600.0, help="s of load")
    parser.add_argument("--warmup", type=float, default=None,
                        help="s of load before the slopes are fitted (default: 600 s, at "
                        "most a third of the run)")  # fmt: skip
    parser.add_argument("--interval", type=float, default=10.0, help="s between samples")
    parser.add_argument("--rate-scale", type=float, default=1.0,
                        help="arrivals × the trace's (azure-conv: 5.5 req/s native)")  # fmt: skip
    parser.add_argument("--trace", default=TraceKind.AZURE_CONV.value,
                        choices=[k.value for k in TraceKind])  # fmt: skip
    parser.add_argument("--regions", default=None,
                        help="regions of the example topology: ids (comma-separated) or a "
                        "count of its first ones (default: all). Keep one in the EEA: the "
                        "example policy serves GDPR clients there only")  # fmt: skip
    parser.add_argument("--speedup", type=float, default=1.0, help="emulated GPUs' speedup")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-input-tokens", type=int, default=LoadConfig().max_input_tokens)
    parser.add_argument("--max-output-tokens", type=int, default=LoadConfig().max_output_tokens)
    parser.add_argument("--request-timeout", type=float, default=LoadConfig().timeout_s)
    parser.add_argument("--settle", type=float, default=60.0,
                        help="s the descriptors get to come back after the load")  # fmt: skip
    parser.add_argument("--tracemalloc", metavar="KINDS", default="",
                        help="trace allocations in these kinds of process (comma-separated: "
                        "gtm up,global,regional,zone,gpu-sim) from the end of the warm-up; print "
                        "what grew")  # fmt: skip
    parser.add_argument("--tracemalloc-frames", type=int, default=None, metavar="N",
                        help="frames per traced allocation (default: gtm.memdebug's); 0: "
                        "no tracing, only the allocator figures")  # fmt: skip
    parser.add_argument("--report", type=Path, default=ROOT / "reports" / "soak",
                        help="directory for the table, the samples (CSV) and the plot")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args()
    if args.smoke:
        args.duration, args.regions, args.interval = 40.0, SMOKE_REGIONS, 2.0
        args.rate_scale, args.settle = min(args.rate_scale, 0.5), 20.0
        args.warmup = 10.0
    if args.warmup is None:
        args.warmup = min(600.0, args.duration / 3)
    work = Path(tempfile.mkdtemp(prefix="gtm-soak-"))
    try:
        try:
            run = asyncio.run(soak(args, work))
        except asyncio.CancelledError:
            raise SystemExit("soak: stopped (SIGTERM); the deployment was stopped") from None
        text, missed = report(args, run)
        print(text)
        if not args.smoke:
            args.report.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            (args.report / f"soak-{stamp}.md").write_text(
                " ".join(sys.argv) + "\n\n" + text + "\n", "utf-8"
            )
            write_series(run, args.report / f"soak-{stamp}.csv")
            if plot(run, args.report / f"soak-{stamp}.png"):
                print(f"plot: {args.report / f'soak-{stamp}.png'}")
        if missed:
            print(f"target missed ({len(missed)}):")
            for line in missed[:40]:
                print(f"  {line}")
            if not args.smoke:
                sys.exit(1)
        else:
            print("target met: 0 errors, every RSS slope < 1 %/h, descriptors back")
    finally:
        if args.keep:
            print(f"run directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

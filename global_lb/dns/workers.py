"""``SO_REUSEPORT`` DNS worker processes (``gtm global --dns-workers N``).

One Python process answers UDP on one core at most (the GIL). With ``N`` workers the
parent (``gtm global``: front door, DNS, health, store watches) is worker 0 and starts
``N - 1`` children, each a DNS-only global tier (``python -m global_lb.dns.workers``)
with its own UDP and TCP sockets bound to the same address with ``SO_REUSEPORT``; the
kernel spreads queries over the sockets by a hash of the client's address and port.

* **Shared snapshot.** Each worker watches the state store, the policies and the regional
  LBs' health itself (the same code as the parent), so each rebuilds its answers when the
  fleet changes — as fast as the parent; with ``--state memory`` each has the same
  static topology and its own health checks.
* **Supervised.** The parent reads each child's stdout: one JSON line when it is ready,
  then its counter totals every :data:`REPORT_INTERVAL` seconds. End of file means the
  child died: it is restarted with backoff (``gtm_global_dns_worker_restarts_total``).
  A child whose parent dies sees end of file on its stdin and exits.
* **Clean shutdown.** ``stop()`` sends SIGTERM and waits; a child that does not exit in
  :data:`STOP_TIMEOUT` seconds is killed.
* **Metrics aggregated.** The parent adds each child's counter increments to its own
  counters of the same name and labels (:class:`~global_lb.metrics.GlobalMetrics`), so
  ``/metrics`` counts the answers of every worker. Gauges and histograms stay per
  process (the parent's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm.clock import Clock
from gtm.errors import ConfigError
from gtm.tasks import Backoff, TaskSupervisor

if TYPE_CHECKING:
    from global_lb.app import GlobalConfig
    from global_lb.metrics import GlobalMetrics

log = logging.getLogger(__name__)

#: Seconds between a child's counter reports (how stale ``/metrics`` may be).
REPORT_INTERVAL = 1.0
#: Seconds a child gets to start (load the geo database, policies, bind) and to stop.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 5.0
#: Restart backoff: a child that dies at start-up is not respawned in a tight loop.
RESTART_BACKOFF = Backoff(initial=0.5, maximum=30.0)
#: Longest line a child may write (counter reports grow with label values).
_LINE_LIMIT = 1 << 24

LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class CounterSample:
    """One counter child's total (sample name ends in ``_total``)."""

    name: str
    labels: LabelSet
    value: float


def counter_samples(registry: CollectorRegistry) -> Iterator[CounterSample]:
    """Every counter total in ``registry``."""
    for family in registry.collect():
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                labels = tuple(sorted(sample.labels.items()))
                yield CounterSample(sample.name, labels, sample.value)


def encode_report(samples: Sequence[CounterSample]) -> str:
    return json.dumps({"counters": [[s.name, dict(s.labels), s.value] for s in samples]})


def decode_report(line: bytes) -> list[CounterSample] | None:
    """The samples of a report line, or ``None`` when it is not one."""
    try:
        data = json.loads(line)
        rows = data["counters"]
        return [
            CounterSample(
                str(name), tuple(sorted((str(k), str(v)) for k, v in labels.items())), float(value)
            )
            for name, labels, value in rows
        ]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class CounterMerger:
    """Adds a child's counter increments to the parent's counters of the same name.

    A child reports totals; the merger remembers the last total per (child, sample) and
    adds the difference. A restarted child starts from zero again: :meth:`forget` it.
    """

    def __init__(self, counters: Sequence[Counter]) -> None:
        self._by_sample = {next(iter(c.describe())).name + "_total": c for c in counters}
        self._last: dict[tuple[int, str, LabelSet], float] = {}

    def add(self, child: int, samples: Sequence[CounterSample]) -> None:
        for sample in samples:
            counter = self._by_sample.get(sample.name)
            if counter is None:
                continue
            key = (child, sample.name, sample.labels)
            delta = sample.value - self._last.get(key, 0.0)
            self._last[key] = sample.value
            if delta > 0:
                target = counter.labels(**dict(sample.labels)) if sample.labels else counter
                target.inc(delta)

    def reported(self, child: int, name: str) -> float:
        """The last total ``child`` reported for sample ``name`` (all label sets)."""
        return sum(v for (c, n, _), v in self._last.items() if c == child and n == name)

    def forget(self, child: int) -> None:
        self._last = {k: v for k, v in self._last.items() if k[0] != child}


def global_counters(metrics: GlobalMetrics) -> list[Counter]:
    return [value for value in vars(metrics).values() if isinstance(value, Counter)]


class DnsWorkers:
    """Starts, supervises and stops the child DNS workers of one ``gtm global``."""

    def __init__(
        self,
        config: GlobalConfig,
        count: int,
        *,
        metrics: GlobalMetrics,
        registry: CollectorRegistry,
        clock: Clock,
        supervisor: TaskSupervisor,
        python: str = sys.executable,
    ) -> None:
        self._config = config
        self._count = count
        self._clock = clock
        self._supervisor = supervisor
        self._python = python
        self._merger = CounterMerger(global_counters(metrics))
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = False
        self._changed = asyncio.Condition()
        self._rng = random.Random()
        self._restarts = Counter(
            "gtm_global_dns_worker_restarts_total",
            "DNS worker processes restarted after they died.",
            registry=registry,
        )
        self._alive = Gauge(
            "gtm_global_dns_workers",
            "DNS worker processes running (children; the parent answers too).",
            registry=registry,
        )

    @property
    def pids(self) -> dict[int, int]:
        """Child index → process id, of the children running now."""
        return {i: p.pid for i, p in self._processes.items() if p.returncode is None}

    def reported(self, child: int, name: str) -> float:
        """The last total of counter sample ``name`` reported by child ``child``."""
        return self._merger.reported(child, name)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds, checked after every report, death and restart."""
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def start(self) -> None:
        """Start every child and wait until each answers DNS."""
        for index in range(1, self._count + 1):
            self._processes[index] = await self._spawn(index)
            self._alive.set(len(self.pids))
            self._supervisor.spawn(f"dns-worker-{index}", self._supervise(index))

    async def stop(self) -> None:
        """SIGTERM to every child, then wait (kill after :data:`STOP_TIMEOUT`)."""
        self._stopping = True
        processes = list(self._processes.values())
        for process in processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
        await asyncio.gather(*(_reap(p) for p in processes))
        self._processes.clear()
        self._alive.set(0)

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            self._python,
            "-m",
            "global_lb.dns.workers",
            "--log-level",
            logging.getLevelName(logging.getLogger().getEffectiveLevel()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT,
            # Its own session: a terminal's Ctrl-C reaches the parent only, which stops
            # the children itself (instead of seeing them die and restarting them).
            start_new_session=True,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(self._config.model_dump_json().encode() + b"\n")
        try:
            await process.stdin.drain()
            async with asyncio.timeout(START_TIMEOUT):
                line = await process.stdout.readline()
            if not line.startswith(b'{"ready"'):
                raise ConfigError(
                    f"DNS worker {index} exited at start-up (status {await process.wait()}); "
                    "its error is logged above"
                )
        except (TimeoutError, ConnectionError) as exc:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise ConfigError(f"DNS worker {index} did not start: {exc or 'timed out'}") from None
        except BaseException:
            await _reap(process)
            raise
        return process

    async def _supervise(self, index: int) -> None:
        attempt = 0
        while True:
            process = self._processes[index]
            await self._pump(index, process)
            status = await process.wait()
            self._alive.set(len(self.pids))
            await self._notify()
            if self._stopping:
                return
            log.warning(
                "DNS worker %d (pid %d) exited with status %s; restarting",
                index,
                process.pid,
                status,
            )
            self._merger.forget(index)
            while True:
                await self._clock.sleep(RESTART_BACKOFF.delay(attempt, self._rng))
                attempt += 1
                try:
                    self._processes[index] = await self._spawn(index)
                except (ConfigError, OSError) as exc:
                    log.warning("DNS worker %d: %s", index, exc)
                    continue
                self._restarts.inc()
                self._alive.set(len(self.pids))
                attempt = 0
                await self._notify()
                break

    async def _pump(self, index: int, process: asyncio.subprocess.Process) -> None:
        """Counter reports until the child's stdout closes (it exited)."""
        assert process.stdout is not None
        while True:
            try:
                line = await process.stdout.readline()
            except ValueError:  # a line over the limit: not a child we can trust
                log.warning("DNS worker %d wrote an overlong line; restarting it", index)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                return
            if not line:
                return
            samples = decode_report(line)
            if samples is not None:
                self._merger.add(index, samples)
                await self._notify()


async def _reap(process: asyncio.subprocess.Process) -> None:
    try:
        async with asyncio.timeout(STOP_TIMEOUT):
            await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


# ---------------------------------------------------------------------------- child


async def _child(config: GlobalConfig) -> None:
    from global_lb.app import GlobalTier
    from global_lb.audit import MemoryAudit
    from gtm.clock import SystemClock
    from gtm.metrics import new_registry

    registry = new_registry()
    # DNS only: no front door, so nothing to audit (DNS queries carry no tenant).
    tier = GlobalTier(config, clock=SystemClock(), registry=registry, audit=MemoryAudit())
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    endpoints = await tier.start()
    # Its own registry: the tier's supervisor already registered the task metrics in
    # ``registry`` (failures here are logged; the report is what the parent watches).
    supervisor = TaskSupervisor(registry=new_registry(), component="dns-worker")
    try:
        _emit(json.dumps({"ready": str(endpoints.dns)}))

        async def report() -> None:
            tier.responder.flush_counts()
            _emit(encode_report(list(counter_samples(registry))))

        async def parent_gone() -> None:
            await stdin.read()  # end of file: the parent exited
            stop.set()

        supervisor.run_loop("report", report, interval=REPORT_INTERVAL)
        supervisor.spawn("parent", parent_gone())
        await stop.wait()
    finally:
        await supervisor.aclose()
        await tier.stop()


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """A child worker: its configuration (JSON) is the first line of stdin."""
    from global_lb.app import GlobalConfig

    parser = argparse.ArgumentParser(description="gtm DNS worker (started by gtm global)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s dns-worker %(levelname)s %(name)s: %(message)s"
    )
    config = GlobalConfig.model_validate_json(sys.stdin.readline())
    try:
        asyncio.run(_child(config))
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Named, supervised background tasks. The only module allowed to call ``create_task``.

asyncio keeps only weak references to tasks, and an exception in a task nobody awaits
is lost until garbage collection. So gtm never fires and forgets: a
:class:`TaskSupervisor` holds every task it starts, names it, logs and counts failures,
and :meth:`TaskSupervisor.run_loop` runs periodic work with backoff, exporting when each
loop last succeeded so that a stuck loop shows up as staleness on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from gtm.clock import Clock, SystemClock
from gtm.outage import OutageLog

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff
    And Jitter", 2015: full jitter spreads reconnect storms best)."""

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Delay before retry number ``attempt`` (0-based)."""
        ceiling = min(self.maximum, self.initial * self.multiplier**attempt)
        return rng.uniform(0.0, ceiling)


class Wake:
    """Asks a loop of :meth:`TaskSupervisor.run_loop` for its next step before its
    interval is up, but no sooner than ``min_interval_s`` after the last one began
    (what a step reads is then fresher, at a bounded cost). Each step answers the asks
    made before it began; ``count`` is called for each step an ask brought forward."""

    def __init__(self, min_interval_s: float, *, count: Callable[[], None] | None = None) -> None:
        if min_interval_s < 0:
            raise ValueError("min_interval_s must be at least 0")
        self.min_interval_s = min_interval_s
        self._count = count
        self._asked = asyncio.Event()

    def ask(self) -> None:
        """The next step, soon (idempotent until it begins)."""
        self._asked.set()

    @property
    def asked(self) -> bool:
        return self._asked.is_set()


async def until(event: asyncio.Event, clock: Clock, seconds: float) -> bool:
    """Wait until ``event`` is set, for at most ``seconds`` of ``clock``'s time; whether
    it was set."""
    if event.is_set():
        return True
    loop = asyncio.get_running_loop()
    timer = loop.create_task(clock.sleep(seconds))
    waiter = loop.create_task(event.wait())
    try:
        await asyncio.wait((timer, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        waiter.cancel()
        await asyncio.gather(timer, waiter, return_exceptions=True)
    return event.is_set()


async def each(items: Iterable[T], step: Callable[[T], Awaitable[None]], *, at_once: int) -> None:
    """``await step(item)`` for every item, at most ``at_once`` going at a time (runners
    sharing one iterator). A thousand at once would each start, and each answer be taken
    in, within a few loop iterations: a zone's health checks of a thousand workers held
    its loop for ~40 ms at a time."""
    if at_once < 1:
        raise ValueError("at_once must be at least 1")
    todo = iter(items)

    async def runner() -> None:
        for item in todo:
            await step(item)

    loop = asyncio.get_running_loop()
    runners = [loop.create_task(runner()) for _ in range(at_once)]
    try:
        await asyncio.gather(*runners)
    except BaseException:
        # A step failed (or we were cancelled): the other runners stop too, none is
        # left running unawaited.
        for task in runners:
            task.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        raise


class Turns:
    """Lets at most ``per_iteration`` callers of :meth:`take` through in one iteration of
    the event loop; the others go in later iterations, first come first served.

    For work that is cheap to wait for and costly to run, arriving in bursts: a scrape
    round's answers come back together, and taking each in costs ~150 µs of the loop
    (parse, calibration), so forty at once would hold every request relayed meanwhile
    for ~6 ms. Taken in ``per_iteration`` at a time, the loop turns between them.
    (A turn given to a waiter cancelled before it ran is lost for that iteration.)"""

    def __init__(self, per_iteration: int) -> None:
        if per_iteration < 1:
            raise ValueError("per_iteration must be at least 1")
        self._per_iteration = per_iteration
        self._left = per_iteration
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._armed = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def take(self) -> None:
        """Return in this iteration if it has a turn left and nobody waits; else in the
        iteration that gives this caller its turn."""
        if self._left > 0 and not self._waiting:
            self._left -= 1
            self._arm()
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        self._arm()
        await turn

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self._next_iteration)

    def _next_iteration(self) -> None:
        # Called once per iteration while turns are taken or callers wait: the turns
        # given here are taken when their callers run, in the next iteration.
        self._armed = False
        self._left = self._per_iteration
        while self._left > 0 and self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                self._left -= 1
        if self._waiting or self._left < self._per_iteration:
            self._arm()


class TaskSupervisor:
    """Owns a set of named background tasks; :meth:`aclose` cancels and awaits them all."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        component: str = "gtm",
    ) -> None:
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._component = component
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._failures = Counter(
            "gtm_task_failures_total",
            "Exceptions raised by supervised background tasks and loops.",
            ["component", "task"],
            registry=registry,
        )
        self._last_success = Gauge(
            "gtm_loop_last_success_timestamp_seconds",
            "Wall-clock time of the last successful iteration of a supervised loop.",
            ["component", "task"],
            registry=registry,
        )

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for name, task in self._tasks.items() if not task.done())

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``coro`` as a task called ``name``; a crash is logged and counted."""
        if name in self._tasks and not self._tasks[name].done():
            coro.close()
            raise ValueError(f"a task named {name!r} is already running")
        task = asyncio.get_running_loop().create_task(coro, name=f"{self._component}:{name}")
        self._tasks[name] = task
        task.add_done_callback(lambda t: self._on_done(name, t))
        return task

    def _on_done(self, name: str, task: asyncio.Task[Any]) -> None:
        # Forget finished tasks, so a supervisor used per connection does not grow.
        if self._tasks.get(name) is task:
            del self._tasks[name]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._failures.labels(self._component, name).inc()
            log.error("background task %s crashed", name, exc_info=exc)

    def run_loop(
        self,
        name: str,
        step: Callable[[], Awaitable[None]],
        *,
        interval: float,
        backoff: Backoff | None = None,
        wake: Wake | None = None,
    ) -> asyncio.Task[Any]:
        """Run ``step`` every ``interval`` seconds; on failure retry with ``backoff``;
        sooner when ``wake`` is asked (:class:`Wake`).

        A failing step never kills the loop: it is counted in ``gtm_task_failures_total``
        and retried; the log says when the loop starts failing and when it is back
        (:class:`gtm.outage.OutageLog`: not once per attempt);
        ``gtm_loop_last_success_timestamp_seconds`` tells how stale the loop's output is.
        """
        return self.spawn(name, self._loop(name, step, interval, backoff or Backoff(), wake))

    async def _loop(
        self,
        name: str,
        step: Callable[[], Awaitable[None]],
        interval: float,
        backoff: Backoff,
        wake: Wake | None,
    ) -> None:
        failures = self._failures.labels(self._component, name)
        outage = OutageLog(f"loop {name}", logger=log, clock=self._clock, count=failures.inc)
        while True:
            if wake is not None:
                wake._asked.clear()  # this step answers the asks made so far
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                outage.failed(exc)
                await self._clock.sleep(backoff.delay(outage.attempts - 1, self._rng))
                continue
            outage.recovered()
            self._last_success.labels(self._component, name).set(self._clock.wall())
            if wake is None or wake.min_interval_s >= interval:
                await self._clock.sleep(interval)
            else:
                await self._nap(interval, wake)

    async def _nap(self, interval: float, wake: Wake) -> None:
        """The pause between two steps: ``interval``, or ``wake.min_interval_s`` when the
        wake is asked by then (or as soon after as it is asked)."""
        await self._clock.sleep(wake.min_interval_s)
        if not wake.asked:
            await until(wake._asked, self._clock, interval - wake.min_interval_s)
        if wake.asked and wake._count is not None:
            wake._count()

    async def aclose(self) -> None:
        """Cancel every task and wait for them to finish."""
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def __aenter__(self) -> TaskSupervisor:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

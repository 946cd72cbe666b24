"""Time, injected. Every component that reads time or waits takes a :class:`Clock`.

Tests use :class:`FakeClock`: time moves only when the test calls :meth:`FakeClock.advance`,
which wakes exactly the sleepers whose deadline has passed — so tests never sleep to wait.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals and deadlines, wall time for records and logs."""

    def monotonic(self) -> float:
        """Seconds on a monotonic clock (arbitrary origin)."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


@dataclass(order=True)
class _Sleeper:
    deadline: float
    seq: int
    future: asyncio.Future[None] = field(compare=False)


class FakeClock:
    """A clock that moves only when told to.

    ``sleep`` suspends until :meth:`advance` moves time past the deadline. ``advance`` is
    async so that woken tasks get to run before it returns (it yields to the loop after
    each wake-up, in deadline order), which keeps multi-step scenarios deterministic.
    """

    def __init__(self, start: float = 1_000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._sleepers: list[_Sleeper] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, _Sleeper(self._now + seconds, next(self._seq), future))
        await future

    @property
    def pending_sleepers(self) -> int:
        """How many sleeps are waiting (handy to await a task reaching its sleep)."""
        return sum(1 for s in self._sleepers if not s.future.done())

    def advance_nowait(self, seconds: float) -> None:
        """Move time forward without waking sleepers (for purely synchronous code)."""
        if seconds < 0:
            raise ValueError("time cannot go backwards")
        self._now += seconds

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking each sleeper whose deadline passes."""
        if seconds < 0:
            raise ValueError("time cannot go backwards")
        target = self._now + seconds
        while self._sleepers and self._sleepers[0].deadline <= target:
            sleeper = heapq.heappop(self._sleepers)
            self._now = max(self._now, sleeper.deadline)
            if not sleeper.future.done():
                sleeper.future.set_result(None)
                # Let the woken task run up to its next await before waking the next one.
                for _ in range(3):
                    await asyncio.sleep(0)
        self._now = target
        await asyncio.sleep(0)

    async def advance_until(
        self, predicate: Callable[[], bool], *, step: float = 0.1, limit: float = 60.0
    ) -> float:
        """Advance in ``step`` increments until ``predicate()`` holds; return time spent.

        For background tasks whose next sleep is registered a few loop iterations after
        they wake: stepping (and settling in between) lets them reach it. Raises
        ``TimeoutError`` after ``limit`` seconds of virtual time, so a test that waits for
        something that never happens fails instead of hanging.
        """
        spent = 0.0
        while not predicate():
            if spent >= limit:
                raise TimeoutError(f"condition not reached within {limit} virtual seconds")
            await self.settle()
            if predicate():
                break
            await self.advance(step)
            spent += step
        return spent

    async def settle(self, rounds: int = 10) -> None:
        """Give ready tasks a few loop iterations without moving time."""
        for _ in range(rounds):
            await asyncio.sleep(0)

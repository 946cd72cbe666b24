"""zone_agent.upstream's read deadlines: one table, one sweeping timer per pool, a tenth
of the timeout apart; a wait fails with TimeoutError once past its deadline, a wait that
ended first never does. Time and timers are a fake loop's, driven by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from zone_agent.upstream import _Deadlines


class _Handle:
    def __init__(self, due: float, callback: Callable[[], None]) -> None:
        self.due, self.callback, self.cancelled = due, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _Clock:
    """The loop's ``time`` and ``call_later``, by hand: :meth:`advance` runs what is due."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(self.now + delay, callback)
        self.timers.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for handle in [h for h in self.timers if h.due <= self.now and not h.cancelled]:
            self.timers.remove(handle)
            handle.callback()

    @property
    def armed(self) -> list[_Handle]:
        return [h for h in self.timers if not h.cancelled]


def _loop(clock: _Clock) -> asyncio.AbstractEventLoop:
    return cast(asyncio.AbstractEventLoop, cast(Any, clock))


async def test_waits_past_their_deadline_fail_and_one_timer_sweeps_them_all() -> None:
    clock, real = _Clock(), asyncio.get_running_loop()
    deadlines = _Deadlines(2.0)  # swept every 0.2 s
    early = [real.create_future() for _ in range(50)]
    for waiter in early:
        deadlines.add(waiter, _loop(clock))
    clock.advance(1.0)
    later = real.create_future()
    deadlines.add(later, _loop(clock))
    assert len(clock.armed) == 1  # one timer for every wait
    clock.advance(0.9)  # t = 1.9: nothing due yet
    assert not any(w.done() for w in [*early, later])
    clock.advance(0.2)  # t = 2.1: the first 50 are past 2.0
    for waiter in early:
        with pytest.raises(TimeoutError):
            waiter.result()
    assert not later.done()
    clock.advance(1.0)  # t = 3.1: the last one is past 3.0
    with pytest.raises(TimeoutError):
        later.result()
    clock.advance(0.2)
    assert clock.armed == []  # nothing waits: the sweep stops


async def test_a_wait_that_ended_first_is_never_failed() -> None:
    clock, real = _Clock(), asyncio.get_running_loop()
    deadlines = _Deadlines(1.0)
    answered, gone = real.create_future(), real.create_future()
    deadlines.add(answered, _loop(clock))
    deadlines.add(gone, _loop(clock))
    answered.set_result(None)
    deadlines.discard(answered)
    deadlines.discard(gone)
    clock.advance(5.0)
    assert answered.result() is None
    assert not gone.done()
    assert clock.armed == []


async def test_a_wait_times_out_at_most_a_tenth_of_the_timeout_late() -> None:
    clock, real = _Clock(), asyncio.get_running_loop()
    deadlines = _Deadlines(0.5)  # swept every 0.05 s
    first = real.create_future()
    deadlines.add(first, _loop(clock))  # arms the sweep at t = 0
    clock.advance(0.01)
    waiter = real.create_future()
    deadlines.add(waiter, _loop(clock))  # due at 0.51
    while not waiter.done():
        clock.advance(0.01)
    assert 0.51 <= clock.now <= 0.51 + 0.05 + 1e-9
    for timed_out in (first, waiter):
        with pytest.raises(TimeoutError):
            timed_out.result()


async def test_closing_stops_the_sweep() -> None:
    clock, real = _Clock(), asyncio.get_running_loop()
    deadlines = _Deadlines(10.0)
    deadlines.add(real.create_future(), _loop(clock))
    deadlines.close()
    assert clock.armed == []

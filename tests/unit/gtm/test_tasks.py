import asyncio
import random

import pytest

from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.tasks import Backoff, TaskSupervisor, Turns, Wake, each, until


def test_backoff_is_bounded_full_jitter() -> None:
    backoff = Backoff(initial=0.1, maximum=2.0, multiplier=2.0)
    rng = random.Random(7)
    for attempt in range(12):
        ceiling = min(2.0, 0.1 * 2.0**attempt)
        delays = [backoff.delay(attempt, rng) for _ in range(50)]
        assert all(0.0 <= d <= ceiling for d in delays)
    assert max(backoff.delay(30, rng) for _ in range(200)) > 1.0  # reaches the cap region


async def test_run_loop_survives_failures_and_exports_last_success() -> None:
    clock = FakeClock(start=0.0, wall_offset=100.0)
    registry = new_registry()
    calls: list[float] = []
    succeeded = asyncio.Event()

    async def step() -> None:
        calls.append(clock.monotonic())
        if len(calls) <= 2:
            raise RuntimeError("transient")
        succeeded.set()

    async with TaskSupervisor(registry=registry, clock=clock, rng=random.Random(1)) as tasks:
        tasks.run_loop("poll", step, interval=1.0, backoff=Backoff(initial=0.5, maximum=0.5))
        while not succeeded.is_set():
            await clock.advance(0.5)
        assert "poll" in tasks.names
    labels = {"component": "gtm", "task": "poll"}
    assert registry.get_sample_value("gtm_task_failures_total", labels) == 2.0
    assert registry.get_sample_value("gtm_loop_last_success_timestamp_seconds", labels) == (
        100.0 + calls[-1]
    )


async def test_a_woken_loop_steps_after_its_least_interval_and_counts_it() -> None:
    clock = FakeClock(start=0.0)
    steps: list[float] = []
    early: list[float] = []
    wake = Wake(0.5, count=lambda: early.append(clock.monotonic()))

    async def step() -> None:
        steps.append(clock.monotonic())

    async def advance(seconds: float) -> None:
        # (Time moves in the loop's own steps, each settled: a nap's second sleep
        # starts when its first ends. Binary fractions: exact sums.)
        await clock.advance(seconds)
        await clock.settle()

    async with TaskSupervisor(registry=new_registry(), clock=clock) as tasks:
        tasks.run_loop("scrape", step, interval=8.0, wake=wake)
        await clock.settle()
        assert steps == [0.0]
        await advance(0.5)
        await advance(7.5)  # not asked: the interval
        assert steps == [0.0, 8.0]
        wake.ask()  # asked at once: no sooner than the least interval
        await advance(0.25)
        assert steps == [0.0, 8.0]
        await advance(0.25)
        assert steps == [0.0, 8.0, 8.5]
        await advance(0.5)
        await advance(1.0)
        wake.ask()  # asked mid-wait: at once
        wake.ask()  # (asked twice before a step: one step)
        await clock.settle()
        assert steps == [0.0, 8.0, 8.5, 10.0]
        await advance(0.5)
        await advance(7.5)
        assert steps == [0.0, 8.0, 8.5, 10.0, 18.0]
    assert early == [8.5, 10.0]
    assert clock.pending_sleepers == 0  # the naps left no sleep behind


def test_a_wake_needs_a_least_interval_of_zero_or_more() -> None:
    with pytest.raises(ValueError, match="at least 0"):
        Wake(-1.0)


async def test_spawn_counts_a_crash_and_refuses_duplicate_names() -> None:
    registry = new_registry()
    crashed = asyncio.Event()

    async def boom() -> None:
        crashed.set()
        raise ValueError("bug")

    async with TaskSupervisor(registry=registry, component="test") as tasks:
        task = tasks.spawn("boom", boom())
        await crashed.wait()
        with pytest.raises(ValueError, match="bug"):
            await task
        never = asyncio.Event()
        tasks.spawn("waiter", never.wait())
        coro = never.wait()
        with pytest.raises(ValueError, match="already running"):
            tasks.spawn("waiter", coro)
    assert (
        registry.get_sample_value("gtm_task_failures_total", {"component": "test", "task": "boom"})
        == 1.0
    )


async def test_aclose_cancels_everything() -> None:
    tasks = TaskSupervisor(registry=new_registry())
    never = asyncio.Event()
    task = tasks.spawn("forever", never.wait())
    await tasks.aclose()
    assert task.cancelled()
    assert tasks.names == frozenset()


async def test_finished_tasks_are_forgotten() -> None:
    async with TaskSupervisor(registry=new_registry()) as tasks:
        for i in range(100):
            await tasks.spawn(f"short-{i}", asyncio.sleep(0))
        await asyncio.sleep(0)  # let the done-callbacks run
        assert tasks.names == frozenset()
        assert len(tasks._tasks) == 0  # no growth when used per connection
        tasks.spawn("short-0", asyncio.sleep(0))  # a finished name can be reused


async def test_until_returns_when_the_event_is_set_or_the_clock_runs_out() -> None:
    clock = FakeClock(start=0.0)
    event = asyncio.Event()
    assert list(await asyncio.gather(until(event, clock, 5.0), _set_after(event, 3))) == [
        True,
        None,
    ]
    assert clock.monotonic() == 0.0  # no time needed
    late = asyncio.Event()
    async with TaskSupervisor(registry=new_registry()) as tasks:
        waiting = tasks.spawn("until", until(late, clock, 2.0))
        await clock.settle()
        await clock.advance(1.5)
        assert not waiting.done()
        await clock.advance(0.5)
        assert await waiting is False
    assert clock.pending_sleepers == 0  # nothing left behind


async def _set_after(event: asyncio.Event, iterations: int) -> None:
    for _ in range(iterations):
        await asyncio.sleep(0)
    event.set()


async def _iterations(counter: list[int], done: asyncio.Event) -> None:
    """Count the loop's iterations (this task takes one turn in each)."""
    while not done.is_set():
        counter[0] += 1
        await asyncio.sleep(0)


async def test_turns_let_a_few_callers_through_per_loop_iteration_in_arrival_order() -> None:
    turns = Turns(3)
    iteration = [0]
    done = asyncio.Event()
    passed: list[tuple[int, int]] = []  # (caller, iteration it ran in)

    async def caller(n: int) -> None:
        await turns.take()
        passed.append((n, iteration[0]))

    async def burst() -> None:
        await asyncio.sleep(0)
        await asyncio.gather(*(caller(n) for n in range(10)))
        done.set()

    await asyncio.gather(_iterations(iteration, done), burst())
    assert [n for n, _ in passed] == list(range(10))  # first come, first served
    per_iteration: dict[int, int] = {}
    for _, at in passed:
        per_iteration[at] = per_iteration.get(at, 0) + 1
    assert max(per_iteration.values()) <= 3
    assert len(per_iteration) >= 4  # ten callers, three at a time
    assert turns.waiting == 0


async def test_a_turn_is_not_given_to_a_cancelled_caller() -> None:
    turns = Turns(1)
    order: list[str] = []

    async def caller(name: str) -> None:
        await turns.take()
        order.append(name)

    async with TaskSupervisor(registry=new_registry()) as tasks:
        callers = {name: tasks.spawn(name, caller(name)) for name in ("a", "b", "c")}
        await asyncio.sleep(0)  # all three asked in one iteration: "a" went, two wait
        assert (order, turns.waiting) == (["a"], 2)
        callers["b"].cancel()
        await asyncio.gather(*callers.values(), return_exceptions=True)
    assert order == ["a", "c"]
    assert turns.waiting == 0
    with pytest.raises(ValueError, match="at least 1"):
        Turns(0)


async def test_each_keeps_at_most_so_many_steps_going_and_does_every_item() -> None:
    going, most, done = 0, 0, []
    release = asyncio.Event()

    async def step(item: int) -> None:
        nonlocal going, most
        going += 1
        most = max(most, going)
        await release.wait()
        going -= 1
        done.append(item)

    async def open_later() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert going == 5  # the others wait for a runner
        release.set()

    await asyncio.gather(each(range(23), step, at_once=5), open_later())
    assert most == 5
    assert sorted(done) == list(range(23))
    await each([], step, at_once=3)  # nothing to do: returns
    with pytest.raises(ValueError, match="at least 1"):
        await each([1], step, at_once=0)


async def test_each_stops_every_runner_when_a_step_fails() -> None:
    started: list[int] = []

    async def step(item: int) -> None:
        started.append(item)
        if item == 1:
            raise RuntimeError("step 1 failed")
        for _ in range(3):
            await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="step 1 failed"):
        await each(range(40), step, at_once=3)
    for _ in range(200):  # time enough for runners left going to do every item
        await asyncio.sleep(0)
    assert len(started) < 10  # the other runners were cancelled

import asyncio

import pytest

from gtm.clock import FakeClock, SystemClock


async def test_fake_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = FakeClock(start=0.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    async with asyncio.TaskGroup() as group:
        group.create_task(sleeper("late", 5.0))
        group.create_task(sleeper("early", 1.0))
        await clock.settle()
        assert clock.pending_sleepers == 2
        await clock.advance(0.5)
        assert woke == []
        await clock.advance(10.0)
    assert woke == [("early", 1.0), ("late", 5.0)]
    assert clock.monotonic() == 10.5


async def test_fake_clock_wall_follows_monotonic() -> None:
    clock = FakeClock(start=10.0, wall_offset=1000.0)
    assert clock.wall() == 1010.0
    await clock.advance(2.5)
    assert clock.wall() == 1012.5


async def test_fake_clock_refuses_to_go_backwards() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError, match="backwards"):
        await clock.advance(-1)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance_nowait(-1)


async def test_zero_sleep_yields_without_registering() -> None:
    clock = FakeClock()
    await clock.sleep(0)
    assert clock.pending_sleepers == 0


async def test_system_clock_is_monotonic_and_near_wall_time() -> None:
    import time

    clock = SystemClock()
    first = clock.monotonic()
    await clock.sleep(0)
    assert clock.monotonic() >= first
    assert abs(clock.wall() - time.time()) < 1.0

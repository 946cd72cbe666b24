import asyncio
import random

import pytest

from chaos.proxy.pipe import EOF, Channel, Chunk, Parker, Signal, Stub
from gtm.clock import FakeClock


def test_channel_is_bounded() -> None:
    channel = Channel(2)
    assert channel.offer(Chunk(b"a", 0.0))
    assert channel.offer(Chunk(b"b", 0.0))
    assert not channel.offer(Chunk(b"c", 0.0))
    assert len(channel) == 2


def test_channel_capacity_is_at_least_one() -> None:
    assert Channel(0).capacity == 1


def test_end_of_stream_is_sticky() -> None:
    channel = Channel()
    channel.offer(EOF)
    assert channel.poll() is EOF
    assert channel.poll() is EOF


def test_discarding_channel_accepts_and_drops() -> None:
    channel = Channel(1)
    channel.offer(Chunk(b"a", 0.0))
    channel.discard()
    assert channel.offer(Chunk(b"b", 0.0))
    assert channel.offer(Chunk(b"c", 0.0))
    assert channel.poll() is None


def test_take_all_empties_in_order() -> None:
    channel = Channel(3)
    chunks = [Chunk(bytes([i]), 0.0) for i in range(3)]
    for chunk in chunks:
        channel.offer(chunk)
    assert channel.take_all() == chunks
    assert channel.poll() is None


async def test_offer_and_poll_wake_the_other_side() -> None:
    channel = Channel(1)
    consumer, producer = Parker(), Parker()
    channel.consumer, channel.producer = consumer, producer
    waiting = asyncio.get_running_loop().create_future()

    async def consume() -> None:
        waiting.set_result(None)
        await consumer.park()

    async with asyncio.TaskGroup() as group:
        task = group.create_task(consume())
        await waiting
        channel.offer(Chunk(b"x", 0.0))
        await task
    assert channel.poll() == Chunk(b"x", 0.0)


def _stub(clock: FakeClock, spawn: object = None) -> tuple[Stub, Channel]:
    out = Channel()
    stub = Stub(
        None,
        inbox=Channel(),
        output=out,
        clock=clock,
        rng=random.Random(0),
        spawn=spawn or (lambda coro: coro.close()),  # type: ignore[arg-type]
    )
    return stub, out


async def test_interrupting_a_stopped_stub_is_immediate(fake_clock: FakeClock) -> None:
    stub, _ = _stub(fake_clock)
    assert await stub.interrupt()


async def test_closed_stub_cannot_be_interrupted(fake_clock: FakeClock) -> None:
    stub, _ = _stub(fake_clock)
    stub.close()
    assert stub.closed
    assert not await stub.interrupt()


async def test_committed_stub_cannot_be_interrupted(fake_clock: FakeClock) -> None:
    stub, _ = _stub(fake_clock)
    stub.commit_to_close()
    assert not await stub.interrupt()


async def test_interrupted_send_keeps_the_chunk_in_the_backlog(fake_clock: FakeClock) -> None:
    stub, out = _stub(fake_clock)
    out.offer(Chunk(b"full", 0.0))
    chunk = Chunk(b"held", 0.0)
    async with asyncio.TaskGroup() as group:
        sending = group.create_task(stub.send(chunk))
        await asyncio.sleep(0)
        stub._interrupt = True
        stub.wake()
        assert await sending is False
    assert list(stub.backlog) == [chunk]


async def test_receive_times_out_on_the_clock(fake_clock: FakeClock) -> None:
    async with asyncio.TaskGroup() as group:
        stub, _ = _stub(fake_clock, spawn=group.create_task)
        receiving = group.create_task(stub.receive(within=0.5))
        await fake_clock.settle()
        await fake_clock.advance(0.5)
        assert await receiving is Signal.TIMED_OUT


async def test_sleep_is_cut_short_by_an_interrupt(fake_clock: FakeClock) -> None:
    async with asyncio.TaskGroup() as group:
        stub, _ = _stub(fake_clock, spawn=group.create_task)
        sleeping = group.create_task(stub.sleep(10))
        await fake_clock.settle()
        stub._interrupt = True
        stub.wake()
        assert await sleeping is False
        assert fake_clock.pending_sleepers == 0


@pytest.mark.parametrize("seconds", [0.0, -1.0])
async def test_sleep_of_no_time_returns_at_once(fake_clock: FakeClock, seconds: float) -> None:
    stub, _ = _stub(fake_clock)
    assert await stub.sleep(seconds)

import random
import struct

from chaos.proxy.link import Link
from chaos.proxy.models import Direction
from chaos.proxy.toxics import BandwidthToxic, LatencyToxic, LimitDataToxic, TimeoutToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import MemorySink, running_link, slot


async def test_passes_data_and_closes_the_sink_at_end_of_stream(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock) as h:
        await h.feed(b"one")
        await h.feed(b"two")
        assert h.sink.data == b"onetwo"
        await h.eof()
        assert h.sink.closed
        assert h.link.finished.is_set()


async def test_no_data_dropped_while_toxics_come_and_go(fake_clock: FakeClock) -> None:
    # Port of link_test.go TestNoDataDropped: a 1 s latency toxic is added and removed
    # over and over while counters stream through; every one arrives, in order.
    toxic = slot(LatencyToxic(latency=1000))
    values = range(3000)
    async with running_link(fake_clock) as h:
        for value in values:
            h.source.feed(struct.pack(">H", value))
            if value % 7 == 0:
                await h.toxics.add(toxic)
            if value % 7 == 3:
                await h.toxics.remove(toxic)
            if value % 5 == 0:
                await h.settle()
        if toxic in h.toxics.slots():
            await h.toxics.remove(toxic)
        await h.eof()
        assert h.sink.data == b"".join(struct.pack(">H", v) for v in values)
        assert h.sink.closed


async def test_toxicity_zero_is_a_noop_until_updated(fake_clock: FakeClock) -> None:
    # Port of link_test.go TestToxicity.
    toxic = slot(TimeoutToxic(timeout=0), toxicity=0.0)
    async with running_link(fake_clock, [toxic]) as h:
        await h.feed(b"*")
        assert h.sink.data == b"*"
        await h.toxics.update(toxic, toxic=TimeoutToxic(timeout=100), toxicity=1.0)
        await h.feed(b"*")
        await h.advance(0.099)
        assert not h.sink.closed
        await h.advance(0.002)
        assert h.sink.closed
        assert h.sink.data == b"*"


async def test_toxicity_is_drawn_per_link_from_the_injected_rng(fake_clock: FakeClock) -> None:
    # One roll per connection and direction when the link starts (not per chunk).
    rolls = random.Random(42)
    expected = [rolls.random() < 0.5 for _ in range(12)]
    shared = random.Random(42)
    hit = []
    for _ in range(12):
        async with running_link(fake_clock, [slot(TimeoutToxic(), toxicity=0.5)], rng=shared) as h:
            for _ in range(3):
                await h.feed(b"x")
            assert h.sink.data in (b"", b"xxx")
            hit.append(h.sink.data == b"")
    assert hit == expected
    assert 0 < sum(hit) < 12


async def test_update_rerolls_toxicity(fake_clock: FakeClock) -> None:
    toxic = slot(TimeoutToxic(), toxicity=0.5)
    # Seed 1 draws "toxic" (0.13 < 0.5) at start, then "noop" (0.85) on the update.
    async with running_link(fake_clock, [toxic], rng=random.Random(1)) as h:
        await h.feed(b"a")
        assert h.sink.data == b""
        await h.toxics.update(toxic, toxic=TimeoutToxic(), toxicity=0.5)
        await h.feed(b"b")
        assert h.sink.data == b"b"


async def test_stub_buffers_follow_the_toxic_type(fake_clock: FakeClock) -> None:
    chain = [slot(LatencyToxic(), name="l"), slot(BandwidthToxic(rate=100), name="b")]
    async with running_link(fake_clock, chain) as h:
        stubs = h.link.stubs
        assert [s.inbox.capacity for s in stubs] == [1, 1024, 1]
        assert stubs[0].config is None
        assert [s.config for s in stubs[1:]] == chain


async def test_added_stateful_toxic_gets_state(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock) as h:
        await h.toxics.add(slot(LimitDataToxic(bytes=10)))
        assert h.link.stubs[-1].state is not None
        assert h.link.stubs[0].state is None


async def test_toxic_added_to_a_live_link_applies_to_later_data(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock) as h:
        await h.feed(b"before")
        await h.toxics.add(slot(LatencyToxic(latency=100)))
        await h.feed(b"after")
        assert h.sink.data == b"before"
        await h.advance(0.1)
        assert h.sink.data == b"beforeafter"


async def test_upstream_and_downstream_chains_are_separate(fake_clock: FakeClock) -> None:
    up = slot(TimeoutToxic(timeout=0), direction=Direction.UPSTREAM)
    async with running_link(fake_clock, [up], direction=Direction.DOWNSTREAM) as h:
        await h.feed(b"down")
        assert h.sink.data == b"down"
        assert len(h.link.stubs) == 1


class BrokenSink(MemorySink):
    def write(self, data: bytes) -> None:
        raise ConnectionResetError("peer went away")


async def test_a_broken_sink_ends_the_link_without_blocking_the_reader(
    fake_clock: FakeClock,
) -> None:
    async with running_link(fake_clock) as h:
        broken = BrokenSink(fake_clock)
        h.link._sink = broken
        for _ in range(50):
            await h.feed(b"x" * 100)  # would block on a full channel if not discarded
        assert h.link.finished.is_set()
        assert broken.closed


async def test_abort_stops_every_task(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(LatencyToxic(latency=10_000))]) as h:
        await h.feed(b"x")
        h.link.abort()
        await h.settle()
        assert not h.link.alive
        assert not h.link._tasks


def test_link_exposes_its_direction(fake_clock: FakeClock) -> None:
    link = Link(
        Direction.UPSTREAM,
        source=None,  # type: ignore[arg-type]
        sink=MemorySink(fake_clock),
        clock=fake_clock,
        rng=random.Random(0),
        task_factory=lambda coro: None,  # type: ignore[arg-type,return-value]
    )
    assert link.direction is Direction.UPSTREAM
    assert link.stubs == ()

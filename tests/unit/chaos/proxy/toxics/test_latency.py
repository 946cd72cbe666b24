import pytest

from chaos.proxy.toxics import LatencyToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot


async def test_chunk_is_released_latency_after_receipt(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(LatencyToxic(latency=100))]) as h:
        start = fake_clock.monotonic()
        await h.feed(b"hello")
        await h.advance(0.099)
        assert h.sink.writes == []
        await h.advance(0.002)
        ((released, data),) = h.sink.writes
        assert data == b"hello"
        assert released - start == pytest.approx(0.1)


async def test_chunks_keep_their_own_deadline_and_order(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(LatencyToxic(latency=100))]) as h:
        start = fake_clock.monotonic()
        await h.feed(b"a")
        await h.advance(0.05)
        await h.feed(b"b")
        await h.advance(0.2)
        assert [data for _, data in h.sink.writes] == [b"a", b"b"]
        assert [t - start for t, _ in h.sink.writes] == [
            pytest.approx(0.1),
            pytest.approx(0.15),
        ]


async def test_jitter_stays_within_bounds(fake_clock: FakeClock) -> None:
    toxic = LatencyToxic(latency=100, jitter=50)
    async with running_link(fake_clock, [slot(toxic)], seed=7) as h:
        start = fake_clock.monotonic()
        for _ in range(20):
            await h.feed(b"x")
        await h.advance_finely(0.2)
    delays = [t - start for t, _ in h.sink.writes]
    assert len(delays) == 20
    # Each chunk is due at receipt + 100 ms ± 50 ms; a chunk whose draw is shorter than
    # its predecessor's waits for it (no reordering), so release times never decrease.
    assert all(0.05 - 1e-9 <= d <= 0.15 + 1e-9 for d in delays)
    assert delays == sorted(delays)
    assert len({round(d, 3) for d in delays}) > 1, "jitter should vary the delay"


async def test_two_latency_toxics_add_up(fake_clock: FakeClock) -> None:
    chain = [slot(LatencyToxic(latency=500), name=f"l{i}") for i in range(2)]
    async with running_link(fake_clock, chain) as h:
        start = fake_clock.monotonic()
        await h.feed(b"x")
        await h.advance_finely(0.995)
        assert h.sink.writes == []
        await h.advance_finely(0.01)
        # Delivered within the 1 ms step in which the second toxic's timer fires.
        assert [t - start for t, _ in h.sink.writes] == [pytest.approx(1.0, abs=0.002)]


async def test_removal_flushes_the_pending_chunk_at_once(fake_clock: FakeClock) -> None:
    latency = slot(LatencyToxic(latency=10_000))
    async with running_link(fake_clock, [latency]) as h:
        await h.feed(b"held")
        await h.advance(0.01)
        assert h.sink.writes == []
        await h.toxics.remove(latency)
        await h.settle()
        assert h.sink.data == b"held"
        await h.feed(b"after")
        assert h.sink.data == b"heldafter"


async def test_negative_latency_means_no_delay(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(LatencyToxic(latency=-5))]) as h:
        await h.feed(b"now")
        assert h.sink.data == b"now"


async def test_end_of_stream_closes_after_pending_data(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(LatencyToxic(latency=100))]) as h:
        await h.feed(b"x")
        await h.eof()
        assert not h.sink.closed
        await h.advance(0.1)
        assert h.sink.data == b"x"
        assert h.sink.closed

from chaos.proxy.toxics import LatencyToxic, TimeoutToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot


async def test_drops_data_and_closes_after_the_timeout(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(TimeoutToxic(timeout=100))]) as h:
        await h.feed(b"dropped")
        await h.advance(0.099)
        assert not h.sink.closed
        await h.advance(0.002)
        assert h.sink.closed
        assert h.sink.data == b""


async def test_each_chunk_rearms_the_timer(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(TimeoutToxic(timeout=100))]) as h:
        for _ in range(5):
            await h.advance(0.08)
            await h.feed(b"x")
        assert not h.sink.closed
        await h.advance(0.099)
        assert not h.sink.closed
        await h.advance(0.002)
        assert h.sink.closed


async def test_zero_blackholes_forever(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(TimeoutToxic(timeout=0))]) as h:
        await h.feed(b"gone")
        await h.advance(3600)
        assert not h.sink.closed
        assert h.sink.data == b""


async def test_removal_closes_the_connection(fake_clock: FakeClock) -> None:
    toxic = slot(TimeoutToxic(timeout=0))
    async with running_link(fake_clock, [toxic]) as h:
        await h.toxics.remove(toxic)
        await h.settle()
        assert h.sink.closed


async def test_removal_closes_even_when_toxicity_made_it_a_noop(fake_clock: FakeClock) -> None:
    # Toxiproxy runs Cleanup for the configured type, whatever the toxicity roll was.
    toxic = slot(TimeoutToxic(timeout=0), toxicity=0.0)
    async with running_link(fake_clock, [toxic]) as h:
        await h.feed(b"passes")
        assert h.sink.data == b"passes"
        await h.toxics.remove(toxic)
        await h.settle()
        assert h.sink.closed


async def test_removing_a_latency_before_it_does_not_hang(fake_clock: FakeClock) -> None:
    # TestTimeoutToxicDoesNotCauseHang: latency, then a black hole, then remove latency.
    latency = slot(LatencyToxic(latency=10), name="might_block")
    hole = slot(TimeoutToxic(timeout=0), name="timeout")
    async with running_link(fake_clock, [latency, hole]) as h:
        for _ in range(5):
            await h.feed(b"hello")
            await h.advance(0.2)
        await h.toxics.remove(latency)
        await h.settle()
        assert [s.config for s in h.link.stubs[1:]] == [hole]
        assert not h.sink.closed

import pytest

from chaos.proxy.toxics import SlowCloseToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot


async def test_data_passes_and_close_waits_for_the_delay(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(SlowCloseToxic(delay=200))]) as h:
        await h.feed(b"data")
        assert h.sink.data == b"data"
        start = fake_clock.monotonic()
        await h.eof()
        await h.advance(0.199)
        assert not h.sink.closed
        await h.advance(0.002)
        assert h.sink.closed_at is not None
        assert h.sink.closed_at - start == pytest.approx(0.2)


async def test_removing_it_during_the_wait_closes_at_once(fake_clock: FakeClock) -> None:
    toxic = slot(SlowCloseToxic(delay=10_000))
    async with running_link(fake_clock, [toxic]) as h:
        await h.eof()
        await h.advance(1)
        assert not h.sink.closed
        await h.toxics.remove(toxic)
        await h.settle()
        assert h.sink.closed


async def test_update_during_the_wait_restarts_it(fake_clock: FakeClock) -> None:
    toxic = slot(SlowCloseToxic(delay=10_000))
    async with running_link(fake_clock, [toxic]) as h:
        await h.eof()
        await h.advance(1)
        await h.toxics.update(toxic, toxic=SlowCloseToxic(delay=100), toxicity=1.0)
        await h.advance(0.099)
        assert not h.sink.closed
        await h.advance(0.002)
        assert h.sink.closed

import pytest

from chaos.proxy.toxics import BandwidthToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot


async def test_rate_is_bytes_per_millisecond(fake_clock: FakeClock) -> None:
    # rate 1 KB/s = 1 byte/ms: 50 bytes take 50 ms.
    async with running_link(fake_clock, [slot(BandwidthToxic(rate=1))]) as h:
        start = fake_clock.monotonic()
        await h.feed(b"x" * 50)
        await h.advance(0.049)
        assert h.sink.writes == []
        await h.advance(0.002)
        assert [t - start for t, _ in h.sink.writes] == [pytest.approx(0.05)]


async def test_large_chunks_are_sliced_every_100_ms(fake_clock: FakeClock) -> None:
    # rate*100 = 100 bytes per 100 ms slice; 350 bytes = 3 slices + 50 bytes at 350 ms.
    async with running_link(fake_clock, [slot(BandwidthToxic(rate=1))]) as h:
        start = fake_clock.monotonic()
        await h.feed(bytes(range(256)) + bytes(94))
        for _ in range(40):
            await h.advance(0.01)
        assert [len(data) for _, data in h.sink.writes] == [100, 100, 100, 50]
        assert [t - start for t, _ in h.sink.writes] == [
            pytest.approx(0.1),
            pytest.approx(0.2),
            pytest.approx(0.3),
            pytest.approx(0.35),
        ]
        assert h.sink.data == bytes(range(256)) + bytes(94)


async def test_throughput_over_several_chunks(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(BandwidthToxic(rate=10))]) as h:
        start = fake_clock.monotonic()
        for _ in range(10):
            h.source.feed(b"y" * 500)  # 5 KB at 10 KB/s: 0.5 s
        await h.settle()
        spent = await fake_clock.advance_until(lambda: len(h.sink.data) == 5000, step=0.01)
        assert spent == pytest.approx(0.5, abs=0.011)
        assert h.sink.writes[-1][0] - start == pytest.approx(0.5, abs=1e-6)


async def test_zero_rate_stalls_until_the_toxic_goes(fake_clock: FakeClock) -> None:
    stall = slot(BandwidthToxic(rate=0))
    async with running_link(fake_clock, [stall]) as h:
        await h.feed(b"stuck")
        await h.advance(60)
        assert h.sink.writes == []
        await h.toxics.remove(stall)
        await h.settle()
        assert h.sink.data == b"stuck"


async def test_update_keeps_data_in_order(fake_clock: FakeClock) -> None:
    toxic = slot(BandwidthToxic(rate=1))
    async with running_link(fake_clock, [toxic]) as h:
        await h.feed(b"a" * 250)
        await h.advance(0.1)
        await h.toxics.update(toxic, toxic=BandwidthToxic(rate=1000), toxicity=1.0)
        await h.feed(b"b" * 10)
        await h.advance(0.01)
        assert h.sink.data == b"a" * 250 + b"b" * 10

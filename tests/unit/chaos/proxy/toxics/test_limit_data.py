import pytest

from chaos.proxy.toxics import LimitDataToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot

# Port of toxics/limit_data_test.go: (chunks in, chunks out).
# Port of toxics/limit_data_test.go: (chunks in, chunks out, closed after).
CASES = [
    ("smaller than limit", [50], [50], False),
    ("length matches limit", [100], [100], True),
    ("bigger than limit", [150], [100], True),
    ("several chunks up to limit", [25, 25, 25, 25], [25, 25, 25, 25], True),
    ("second chunk would overflow", [90, 20], [90, 10], True),
]


@pytest.mark.parametrize(("case", "sizes_in", "sizes_out", "closed"), CASES)
async def test_limit(
    fake_clock: FakeClock, case: str, sizes_in: list[int], sizes_out: list[int], closed: bool
) -> None:
    async with running_link(fake_clock, [slot(LimitDataToxic(bytes=100))]) as h:
        for size in sizes_in:
            await h.feed(bytes(size))
        assert [len(chunk) for _, chunk in h.sink.writes] == sizes_out, case
        assert h.sink.closed == closed, case


async def test_limit_zero_closes_on_the_first_chunk(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(LimitDataToxic(bytes=0))]) as h:
        assert not h.sink.closed
        await h.feed(bytes(100))
        assert h.sink.writes == []
        assert h.sink.closed


async def test_below_the_limit_stays_open(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(LimitDataToxic(bytes=100))]) as h:
        await h.feed(bytes(99))
        assert not h.sink.closed


async def test_count_survives_an_update(fake_clock: FakeClock) -> None:
    # TestLimitDataToxicMayBeRestarted: 90 bytes, restart, then only 10 more pass.
    toxic = slot(LimitDataToxic(bytes=100))
    async with running_link(fake_clock, [toxic]) as h:
        await h.feed(bytes(90))
        await h.toxics.update(toxic, toxic=LimitDataToxic(bytes=100), toxicity=1.0)
        await h.feed(bytes(20))
        assert [len(chunk) for _, chunk in h.sink.writes] == [90, 10]
        assert h.sink.closed


async def test_raising_the_limit_lets_more_through(fake_clock: FakeClock) -> None:
    toxic = slot(LimitDataToxic(bytes=100))
    async with running_link(fake_clock, [toxic]) as h:
        await h.feed(bytes(90))
        await h.toxics.update(toxic, toxic=LimitDataToxic(bytes=200), toxicity=1.0)
        await h.feed(bytes(100))
        assert [len(chunk) for _, chunk in h.sink.writes] == [90, 100]
        assert not h.sink.closed


def test_state_is_created_per_stub() -> None:
    toxic = LimitDataToxic(bytes=1)
    assert toxic.new_state() is not toxic.new_state()

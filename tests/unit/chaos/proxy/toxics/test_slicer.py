import itertools
import random

import pytest
from pydantic import ValidationError

from chaos.proxy.toxics import SlicerToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot


async def test_slices_about_average_size(fake_clock: FakeClock) -> None:
    # TestSlicerToxic: 480 KB at 1024 ± 512 reads about 480 times (240..720).
    data = b"hello world " * 40_000
    toxic = SlicerToxic(average_size=1024, size_variation=512, delay=10)
    async with running_link(fake_clock, [slot(toxic)]) as h:
        h.source.feed(data)
        await h.settle()
        await fake_clock.advance_until(lambda: h.sink.data == data, step=0.01)
    assert 240 <= len(h.sink.writes) <= 720
    assert all(len(chunk) <= 1536 for _, chunk in h.sink.writes)


async def test_zero_variation_cuts_single_bytes(fake_clock: FakeClock) -> None:
    data = b"hello world " * 2
    async with running_link(fake_clock, [slot(SlicerToxic(average_size=1, delay=10))]) as h:
        await h.feed(data)
        await h.advance(0.01)
    assert [chunk for _, chunk in h.sink.writes] == [bytes([b]) for b in data]


async def test_pieces_are_delay_microseconds_apart(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(SlicerToxic(average_size=2, delay=1000))]) as h:
        await h.feed(b"abcdefgh")
        await h.advance_finely(0.005)
    times = [t for t, _ in h.sink.writes]
    assert [chunk for _, chunk in h.sink.writes] == [b"ab", b"cd", b"ef", b"gh"]
    assert [round(b - a, 6) for a, b in itertools.pairwise(times)] == [0.001] * 3


def test_average_size_zero_is_refused() -> None:
    with pytest.raises(ValidationError, match="average_size must be at least 1"):
        SlicerToxic(average_size=0)


@pytest.mark.parametrize(("average", "variation"), [(1, 100), (10, 10), (5, -3), (3, 0)])
def test_split_points_cover_the_chunk_whatever_the_values(average: int, variation: int) -> None:
    toxic = SlicerToxic(average_size=average, size_variation=variation)
    pieces = toxic.split_points(1000, random.Random(3))
    assert pieces[0][0] == 0
    assert pieces[-1][1] == 1000
    assert all(a < b for a, b in pieces)
    assert all(prev[1] == nxt[0] for prev, nxt in itertools.pairwise(pieces))

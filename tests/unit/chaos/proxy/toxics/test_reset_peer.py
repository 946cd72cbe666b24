from chaos.proxy.toxics import ResetPeerToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot


async def test_first_chunk_is_dropped_then_closed_after_timeout(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(ResetPeerToxic(timeout=100))]) as h:
        await h.feed(b"lost")
        await h.advance(0.099)
        assert not h.sink.closed
        await h.advance(0.002)
        assert h.sink.closed
        assert h.sink.data == b""


async def test_end_of_stream_also_triggers_it(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(ResetPeerToxic(timeout=50))]) as h:
        await h.eof()
        await h.advance(0.049)
        assert not h.sink.closed
        await h.advance(0.002)
        assert h.sink.closed


async def test_an_idle_connection_is_never_reset(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(ResetPeerToxic(timeout=0))]) as h:
        await h.advance(3600)
        assert not h.sink.closed


async def test_removal_during_the_wait_neither_blocks_nor_saves_it(fake_clock: FakeClock) -> None:
    toxic = slot(ResetPeerToxic(timeout=10_000))
    async with running_link(fake_clock, [toxic]) as h:
        await h.feed(b"x")
        await h.toxics.remove(toxic)  # returns at once: the stub committed to close
        await h.feed(b"y")
        assert h.sink.data == b""
        await h.advance(10)
        assert h.sink.closed


async def test_resets_peer_flag_is_set() -> None:
    assert ResetPeerToxic().resets_peer

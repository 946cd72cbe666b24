from chaos.proxy.toxics import REGISTRY, NoopToxic
from gtm.clock import FakeClock
from tests.unit.chaos.proxy.harness import running_link, slot


async def test_passes_everything_then_closes(fake_clock: FakeClock) -> None:
    async with running_link(fake_clock, [slot(NoopToxic())]) as h:
        await h.feed(b"a")
        await h.feed(b"b")
        await h.eof()
        assert h.sink.data == b"ab"
        assert h.sink.closed


def test_registry_has_every_toxiproxy_type() -> None:
    assert set(REGISTRY) == {
        "noop",
        "latency",
        "bandwidth",
        "slow_close",
        "timeout",
        "reset_peer",
        "slicer",
        "limit_data",
    }
    assert all(cls.type_name == name for name, cls in REGISTRY.items())


def test_attributes_always_serialise_every_field() -> None:
    assert REGISTRY["latency"]().attributes() == {"latency": 0, "jitter": 0}
    assert REGISTRY["slicer"](average_size=1).attributes() == {
        "average_size": 1,
        "size_variation": 0,
        "delay": 0,
    }
    assert REGISTRY["noop"]().attributes() == {}

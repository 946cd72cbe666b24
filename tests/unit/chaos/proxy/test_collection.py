from chaos.proxy.collection import ToxicCollection
from chaos.proxy.models import Direction
from chaos.proxy.toxics import LatencyToxic, NoopToxic, ResetPeerToxic
from tests.unit.chaos.proxy.harness import slot


async def test_lists_upstream_first_then_downstream_in_creation_order() -> None:
    toxics = ToxicCollection()
    d1 = slot(NoopToxic(), name="d1")
    u1 = slot(NoopToxic(), name="u1", direction=Direction.UPSTREAM)
    d2 = slot(LatencyToxic(latency=5), name="d2")
    for item in (d1, u1, d2):
        await toxics.add(item)
    assert [s.name for s in toxics.slots()] == ["u1", "d1", "d2"]
    assert toxics.chain(Direction.DOWNSTREAM) == (d1, d2)
    assert toxics.get("d2") is d2
    assert toxics.get("nope") is None


async def test_views_carry_every_field() -> None:
    toxics = ToxicCollection()
    await toxics.add(slot(LatencyToxic(latency=100, jitter=10), toxicity=0.2))
    (view,) = toxics.views()
    assert view.to_wire() == {
        "attributes": {"latency": 100, "jitter": 10},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 0.2,
    }


async def test_reset_removes_everything_and_reports_counts() -> None:
    counts: list[tuple[Direction, int]] = []
    toxics = ToxicCollection(on_change=lambda d, n: counts.append((d, n)))
    await toxics.add(slot(NoopToxic(), name="a"))
    await toxics.add(slot(NoopToxic(), name="b", direction=Direction.UPSTREAM))
    await toxics.reset()
    assert toxics.slots() == []
    assert counts[-1][1] == 0
    assert (Direction.DOWNSTREAM, 1) in counts


async def test_resets_peer_looks_at_both_chains() -> None:
    toxics = ToxicCollection()
    assert not toxics.resets_peer()
    await toxics.add(slot(ResetPeerToxic(), direction=Direction.UPSTREAM))
    assert toxics.resets_peer()

from __future__ import annotations

import pytest

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.health import HealthStatus
from zone_agent.plugins.round_robin_picker import RoundRobinPicker


@pytest.mark.parametrize(
    ("seq", "dead", "chosen"),
    [(0, set(), "g0"), (1, set(), "g1"), (5, set(), "g2"), (1, {"g1"}, "g2"), (2, {"g2"}, "g0")],
)
def test_turns_skip_removed_gpus(seq: int, dead: set[str], chosen: str) -> None:
    view = make_view([Gpu(f"g{i}") for i in range(3)])
    b = batch(view, make_request(seq=seq))
    for i, gid in enumerate(b.index.ids):
        b.alive[i] = gid not in dead
    scores = RoundRobinPicker().scores(b)
    assert b.index.ids[int(scores.argmax())] == chosen
    assert sorted(scores) == [0.0, 0.0, 1.0]


def test_ignores_health_weights() -> None:
    view = make_view([Gpu("a", health=HealthStatus(True, weight=0.1)), Gpu("b")])
    assert RoundRobinPicker().scores(batch(view, make_request(seq=0)))[0] == 1.0

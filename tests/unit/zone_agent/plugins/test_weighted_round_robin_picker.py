from __future__ import annotations

from collections import Counter

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.plugins.weighted_round_robin_picker import WeightedRoundRobinPicker


def test_turns_are_proportional_to_gpu_speed() -> None:
    view = make_view(
        [Gpu("a", gpu_type="H100"), Gpu("b", gpu_type="A100-80GB"), Gpu("c", gpu_type="H100")]
    )
    picks = []
    for seq in range(30):
        b = batch(view, make_request(seq=seq))
        picks.append(b.index.ids[int(WeightedRoundRobinPicker().scores(b).argmax())])
    assert Counter(picks) == {"a": 12, "c": 12, "b": 6}
    assert picks[:5] == ["a", "b", "c", "a", "c"]  # round 1: all; round 2: weight ≥ 2


def test_removed_gpus_lose_their_turns() -> None:
    view = make_view([Gpu("a", gpu_type="H100"), Gpu("b", gpu_type="A100-80GB")])
    for seq in range(6):
        b = batch(view, make_request(seq=seq))
        b.alive[0] = False
        assert WeightedRoundRobinPicker().scores(b)[1] == 1.0

from __future__ import annotations

import pytest

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.plugins.least_connections_scorer import LeastConnectionsScorer


@pytest.mark.parametrize(
    ("streams", "expected"),
    [
        ({}, [1.0, 1.0, 1.0]),
        ({"a": 2, "b": 1}, [0.0, 0.5, 1.0]),
        ({"a": 1, "b": 1, "c": 1}, [1.0, 1.0, 1.0]),
    ],
)
def test_fewest_in_flight_scores_highest(streams: dict[str, int], expected: list[float]) -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b"), Gpu("c")], acc)
    for gid, n in streams.items():
        acc.start(gid, prefill_tokens=0, sequences=n)
    assert list(LeastConnectionsScorer().scores(batch(view, make_request()))) == expected

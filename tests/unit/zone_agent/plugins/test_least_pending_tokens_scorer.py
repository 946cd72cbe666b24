from __future__ import annotations

import pytest

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.plugins.least_pending_tokens_scorer import LeastPendingTokensScorer


@pytest.mark.parametrize(
    ("pending", "best"),
    [({"a": 100}, "b"), ({"a": 10, "b": 1000}, "a"), ({}, "a")],
)
def test_fewest_pending_tokens_wins(pending: dict[str, int], best: str) -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    for gid, tokens in pending.items():
        acc.start(gid, prefill_tokens=tokens)
    b = batch(view, make_request())
    scores = LeastPendingTokensScorer().scores(b)
    assert b.index.ids[int(scores.argmax())] == best


def test_counts_other_clients_queue_from_a_fresh_scrape() -> None:
    view = make_view([Gpu("a", running=0.0, waiting=5.0), Gpu("b", running=0.0)])
    assert list(LeastPendingTokensScorer().scores(batch(view, make_request()))) == [0.0, 1.0]

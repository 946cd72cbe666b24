from __future__ import annotations

import pytest

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.plugins.prefix_affinity_scorer import PrefixAffinityScorer


def test_matched_share_of_the_prompts_blocks() -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    request = make_request(text="x" * 256 * 4)
    acc.start("a", prefill_tokens=0, prefix_hashes=request.prefix_hashes[:2], prefix_capacity=99)
    assert list(PrefixAffinityScorer().scores(batch(view, request))) == pytest.approx([0.5, 0.0])
    assert list(PrefixAffinityScorer().scores(batch(view, make_request()))) == [0.0, 0.0]

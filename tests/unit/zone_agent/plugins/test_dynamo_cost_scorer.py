from __future__ import annotations

from tests.unit.zone_agent.helpers import Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.plugins.dynamo_cost_scorer import DynamoCostScorer, Params

PROMPT = "dynamo prompt " * 400


def test_overlap_credit_and_decode_blocks() -> None:
    acc = Accounting()
    view = make_view(
        [
            Gpu("a", running=1.0, kv_usage=0.0, kv_blocks=10_000, block_size=16),
            Gpu("b", running=1.0, kv_usage=0.0, kv_blocks=10_000, block_size=16),
        ],
        acc,
    )
    request = make_request(tokens=1400, text=PROMPT)
    acc.start("b", prefill_tokens=0, prefix_hashes=request.prefix_hashes, prefix_capacity=999)
    assert list(DynamoCostScorer().scores(batch(view, request))) == [0.0, 1.0]
    # Without overlap credit only load counts: a is idle, b holds our request's KV.
    assert list(
        DynamoCostScorer(params=Params(overlap_weight=0.0)).scores(batch(view, request))
    ) == [
        1.0,
        1.0,
    ]


def test_busy_kv_loses() -> None:
    view = make_view(
        [
            Gpu("a", running=1.0, kv_usage=0.8, kv_blocks=1000),
            Gpu("b", running=1.0, kv_usage=0.1, kv_blocks=1000),
        ]
    )
    assert list(DynamoCostScorer().scores(batch(view, make_request()))) == [0.0, 1.0]

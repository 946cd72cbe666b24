from __future__ import annotations

import math

import pytest

from gtm.gpu_profiles import get_profile
from gtm.routing.cost import predicted_ttft_ms
from tests.unit.zone_agent.helpers import MODEL, Gpu, batch, make_request, make_view
from zone_agent.accounting import Accounting
from zone_agent.health import HealthStatus
from zone_agent.plugins.ttft_scorer import Params, TtftScorer

PROMPT = "shared system prompt " * 300  # ~6 kB: ~25 blocks


def test_matches_the_scalar_cost_function() -> None:
    acc = Accounting()
    view = make_view([Gpu("a", gpu_type="H100"), Gpu("b", gpu_type="A100-80GB")], acc)
    acc.start("a", prefill_tokens=4000)
    costs = TtftScorer(params=Params(decode_pressure=False)).costs_ms(
        batch(view, make_request(tokens=1000))
    )
    for i, (gpu_type, queued) in enumerate([("H100", 4000), ("A100-80GB", 0)]):
        rate = get_profile(gpu_type, MODEL).prefill_tokens_per_s
        assert costs[i] == pytest.approx(predicted_ttft_ms(0.0, queued, 1000, rate))


@pytest.mark.parametrize(
    ("gpus", "queued", "best"),
    [
        # Same load: the faster GPU type wins.
        ([Gpu("a", gpu_type="A100-80GB"), Gpu("b", gpu_type="H100")], {}, "b"),
        # The H100 is ~2× faster, but not with 8k tokens queued on it.
        ([Gpu("a", gpu_type="A100-80GB"), Gpu("b", gpu_type="H100")], {"b": 20000}, "a"),
        # Slow start / throttling halves the rate: the other GPU wins.
        ([Gpu("a"), Gpu("b", health=HealthStatus(True, weight=0.3))], {"a": 1500}, "a"),
    ],
)
def test_cheapest_gpu_scores_one(gpus: list[Gpu], queued: dict[str, int], best: str) -> None:
    acc = Accounting()
    view = make_view(gpus, acc)
    for gid, tokens in queued.items():
        acc.start(gid, prefill_tokens=tokens)
    b = batch(view, make_request(tokens=2000))
    scores = TtftScorer().scores(b)
    assert b.index.ids[int(scores.argmax())] == best
    assert max(scores) == 1.0
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_cache_affinity_is_a_cost_term() -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    request = make_request(tokens=6000, text=PROMPT)
    acc.start(
        "b", prefill_tokens=0, prefix_hashes=request.prefix_hashes, prefix_capacity=1000
    ).close()
    costs = TtftScorer().costs_ms(batch(view, request))
    assert costs[1] < costs[0] / 5


def test_bounded_load_removes_the_cache_credit_of_a_hot_gpu() -> None:
    acc = Accounting()
    view = make_view([Gpu("a"), Gpu("b")], acc)
    request = make_request(tokens=6000, text=PROMPT)
    for _ in range(10):  # b holds the prefix and 10 streams, a none: over (1+ε)·11/2
        acc.start("b", prefill_tokens=0, prefix_hashes=request.prefix_hashes, prefix_capacity=1000)
    b = batch(view, request)
    capped = TtftScorer(params=Params(decode_pressure=False)).costs_ms(b)
    assert capped[1] == pytest.approx(capped[0])  # no credit: same as uncached


def test_decode_pressure_adds_per_pass_time() -> None:
    view = make_view([Gpu("a", running=200.0, kv_usage=0.9)])
    request = make_request(tokens=100)
    with_pressure = TtftScorer().costs_ms(batch(view, request))[0]
    without = TtftScorer(params=Params(decode_pressure=False)).costs_ms(batch(view, request))[0]
    assert with_pressure > without + 2.0  # at least the per-pass overhead


def test_zero_rate_is_infinite_cost_and_zero_score() -> None:
    view = make_view([Gpu("a")])
    b = batch(view, make_request())
    object.__setattr__(b.index, "ms_per_token", b.index.ms_per_token * math.inf)
    assert TtftScorer().scores(b)[0] == 0.0

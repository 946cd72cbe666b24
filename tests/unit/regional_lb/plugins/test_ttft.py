"""The regional TTFT cost's one home (regional_lb/plugins/ttft.py): its value, and every
user — the scorer, the cost model, spillover's peer price — computing it with it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional_lb.plugins.ttft import TtftScorer, predicted_ttft_ms, prefill_ms, uncached_tokens
from regional_lb.spill import SpillSettings, peer_ttft_ms, spill_options
from regional_lb.view import ZoneBatch, ZoneContext, zone_candidates
from tests.unit.regional_lb.helpers import MODEL, NOW, model_load, peer, route_request, view, zone


def test_the_formula() -> None:
    # 2 ms RTT + 2,000 queued tokens at 10,000 tokens/s (200 ms) + 1,000 own tokens on
    # one of two GPUs (5,000 tokens/s each: 200 ms).
    ok = zone_candidates(view([zone("ok", model_load(queued=2_000))]), MODEL)[0]
    assert predicted_ttft_ms(ok, 1_000.0) == 2.0 + 200.0 + 200.0
    assert prefill_ms(1_000.0, 2, 10_000.0) == 200.0
    # A zone that cannot prefill the model costs inf.
    sick = zone_candidates(view([zone("sick", model_load(healthy=0))]), MODEL)[0]
    assert predicted_ttft_ms(sick, 1_000.0) == math.inf
    # Leading blocks hot in the zone's sketch are not prefilled again.
    hot = zone_candidates(view([zone("hot", sketch=(1, 2))]), MODEL)[0]
    ctx = ZoneContext(view([]), tokens_per_block=300.0)
    assert uncached_tokens(route_request(tokens=1_000, prefix=(1, 2, 3)), hot, ctx) == 400.0


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    queued=st.lists(st.integers(0, 100_000), min_size=1, max_size=4),
    healthy=st.lists(st.integers(0, 4), min_size=4, max_size=4),
    rate=st.sampled_from([0.0, 5_000.0, 12_345.0]),
    tokens=st.integers(0, 40_000),
    per_block=st.sampled_from([0.0, 64.0, 512.0]),
)
def test_the_scorer_and_the_cost_model_price_every_zone_with_the_formula(
    queued: list[int], healthy: list[int], rate: float, tokens: int, per_block: float
) -> None:
    infos = [
        zone(f"z{k}", model_load(queued=q, healthy=min(h, 2), rate=rate), sketch=(1,) * (k % 2))
        for k, (q, h) in enumerate(zip(queued, healthy, strict=False))
    ]
    regional = view(infos)
    zones = zone_candidates(regional, MODEL)
    request = route_request(tokens=tokens, prefix=(1, 2))
    ctx = ZoneContext(regional, tokens_per_block=per_block)
    costs = TtftScorer().costs_ms(ZoneBatch(request, zones, ctx))
    assert costs == [predicted_ttft_ms(z, uncached_tokens(request, z, ctx)) for z in zones]


@pytest.mark.parametrize("tokens", [0, 1, 999, 40_000])
def test_spillover_prices_a_peers_own_prefill_with_the_formula(tokens: int) -> None:
    far = peer("r2", model_load(queued=3_000, healthy=1, rate=7_000.0))
    regional = view([], [far])
    request = route_request(tokens=tokens)
    summary = far.summary
    assert summary is not None
    load = summary.load_for(MODEL)
    assert load is not None
    expected = load.queue_delay_ms() + prefill_ms(tokens, 1, 7_000.0)
    assert peer_ttft_ms(summary, request) == expected
    (option,) = spill_options(
        regional,
        request,
        allowed=frozenset({"r1", "r2"}),
        hops=0,
        now_wall=NOW,
        settings=SpillSettings(),
    )
    assert option.ttft_ms == expected

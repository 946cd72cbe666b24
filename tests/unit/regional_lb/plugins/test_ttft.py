"""The regional TTFT cost's one home (regional_lb/plugins/ttft.py): its value, and every
user — the scorer, the cost model, spillover's peer price — computing it with it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm.models import GpuClassLoad, ModelLoad
from regional_lb.plugins.ttft import TtftScorer, predicted_ttft_ms, prefill_ms, uncached_tokens
from regional_lb.spill import SpillSettings, peer_ttft_ms, spill_options
from regional_lb.view import ZoneAccounting, ZoneBatch, ZoneContext, zone_candidates
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


def mixed_load(*classes: GpuClassLoad, queued: int = 0) -> ModelLoad:
    """A zone's load with GPU classes (what a zone agent publishes), fastest first."""
    gpus = sum(c.healthy_gpus for c in classes)
    return ModelLoad(
        model=MODEL,
        gpus=gpus,
        healthy_gpus=gpus,
        prefill_tokens_per_s=sum(c.prefill_tokens_per_s for c in classes),
        queued_prefill_tokens=queued,
        max_running_requests=64 * gpus,
        classes=classes,
    )


def gpus(name: str, n: int, per_gpu: float, free: int) -> GpuClassLoad:
    return GpuClassLoad(
        gpu_class=name, healthy_gpus=n, prefill_tokens_per_s=n * per_gpu, free_gpus=free
    )


@pytest.mark.parametrize("tokens", [100, 4_000, 30_000])
def test_a_zone_whose_fast_gpu_idles_beside_slow_ones_wins_a_prompt_of_any_size(
    tokens: int,
) -> None:
    # Zone "mixed": a free 20,000 tokens/s GPU and three free 3,000 tokens/s ones (average
    # 7,250); zone "even": four 10,000 tokens/s GPUs, busy behind 2,000 queued tokens.
    mixed = zone("mixed", mixed_load(gpus("fast", 1, 20_000.0, 1), gpus("slow", 3, 3_000.0, 3)))
    even = zone("even", mixed_load(gpus("mid", 4, 10_000.0, 0), queued=2_000))
    regional = view([mixed, even])
    candidates = zone_candidates(regional, MODEL)
    request = route_request(tokens=tokens)
    costs = TtftScorer().costs_ms(ZoneBatch(request, candidates, ZoneContext(regional)))
    assert costs[0] < costs[1]
    assert costs[0] == 2.0 + 0.0 + prefill_ms(tokens, 1, 20_000.0)


def test_a_zone_whose_only_free_gpu_is_slow_is_priced_by_the_cheaper_way_to_start() -> None:
    # One free 2,000 tokens/s GPU; three 20,000 tokens/s ones behind 6,200 queued tokens.
    load = mixed_load(gpus("fast", 3, 20_000.0, 0), gpus("slow", 1, 2_000.0, 1), queued=6_200)
    (candidate,) = zone_candidates(view([zone("z", load)]), MODEL)
    pooled = 1000.0 * 6_200 / 62_000.0
    # A short prompt starts at once on the slow GPU; a long one waits for a fast GPU.
    assert predicted_ttft_ms(candidate, 100) == 2.0 + 0.0 + prefill_ms(100, 1, 2_000.0)
    assert predicted_ttft_ms(candidate, 10_000) == 2.0 + pooled + prefill_ms(10_000, 4, 62_000.0)
    # What we sent since its summary took the free GPU: the backlog for every size.
    accounting = ZoneAccounting()
    accounting.observe(view([zone("z", load)]).zones)
    accounting.start("z", MODEL, 50)
    (taken,) = zone_candidates(view([zone("z", load)]), MODEL, accounting)
    queued = 1000.0 * 6_250 / 62_000.0
    assert predicted_ttft_ms(taken, 100) == 2.0 + queued + prefill_ms(100, 4, 62_000.0)

"""Every ``--metrics-flavor`` writes its engine's names from the engine's own state, and
the zone agent's scraper reads them back to that state."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import generate_latest

from gpusim.engine import Engine, EngineConfig, EngineRequest, FinishedRequest, FinishReason
from gpusim.metrics import EngineMetrics, MetricsFlavor, ModelSnapshot
from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry
from zone_agent.engines import Flavor
from zone_agent.scrape import parse_metrics

#: Engines that export the KV geometry (the others leave it to the profile).
GEOMETRY = {MetricsFlavor.VLLM, MetricsFlavor.SGLANG, MetricsFlavor.TRTLLM, MetricsFlavor.DYNAMO}
#: Engines that export an inter-token latency per token (TGI's is per decode call).
PER_TOKEN_ITL = {
    MetricsFlavor.VLLM,
    MetricsFlavor.SGLANG,
    MetricsFlavor.LLAMACPP,
    MetricsFlavor.DYNAMO,
}


def _loaded_engine() -> Engine:
    profile = dataclasses.replace(get_profile("H100", LLAMA_8B), max_num_seqs=2)
    engine = Engine(profile, EngineConfig(degradation=Degradation(warmup_passes=0)))
    for index in range(5):
        engine.add(EngineRequest(f"r{index}", 700, 6), 0.0)
    return engine


@pytest.mark.parametrize("flavor", list(MetricsFlavor))
def test_the_scraper_reads_back_the_engine_s_own_state(flavor: MetricsFlavor) -> None:
    engine = _loaded_engine()
    registry = new_registry()
    snapshot = lambda: [ModelSnapshot(LLAMA_8B, engine.profile, engine.stats(), 0.0)]  # noqa: E731
    metrics = EngineMetrics(registry, flavor, snapshot)
    now = 0.0
    gaps: list[float] = []
    decode_calls: list[float] = []
    for _ in range(4):
        result = engine.step(now)
        assert result is not None
        metrics.observe_step(LLAMA_8B, result)
        gaps.extend(result.inter_token_latencies)
        if not result.prefill_tokens:
            decode_calls.append(result.duration)
        now += result.duration
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (2, 3)
    assert stats.kv_usage > 0.0

    parsed = parse_metrics(
        generate_latest(registry).decode(), scraped_at=now, default_model=LLAMA_8B
    )
    assert parsed.flavor is Flavor(flavor.value)
    model = parsed.models[LLAMA_8B]
    assert (model.running, model.waiting) == (2.0, 3.0)
    assert model.kv_usage == pytest.approx(stats.kv_usage, rel=1e-12)
    if flavor in GEOMETRY:
        assert (model.block_size, model.kv_blocks_total) == (16, stats.kv_blocks_total)
    else:
        assert (model.block_size, model.kv_blocks_total) == (None, None)
    if flavor in PER_TOKEN_ITL:
        assert model.itl_count == len(gaps) > 0
        assert model.itl_sum == pytest.approx(sum(gaps))
    elif flavor is MetricsFlavor.TGI:  # one observation per decode call
        assert model.itl_count == len(decode_calls) > 0
        assert model.itl_sum == pytest.approx(sum(decode_calls))
    else:
        assert (model.itl_sum, model.itl_count) == (None, None)
    state = {
        figure: registry.get_sample_value(
            "gtm_gpusim_engine_state", {"model_name": LLAMA_8B, "figure": figure}
        )
        for figure in ("running", "waiting", "kv_usage", "kv_blocks_total", "block_size")
    }
    assert state == {
        "running": 2.0,
        "waiting": 3.0,
        "kv_usage": stats.kv_usage,
        "kv_blocks_total": float(stats.kv_blocks_total),
        "block_size": 16.0,
    }


def _finish(engine: Engine, count: int) -> list[FinishedRequest]:
    """Passes until at least ``count`` requests finished; those that did."""
    now = 0.0
    finished: list[FinishedRequest] = []
    while len(finished) < count:
        result = engine.step(now)
        assert result is not None
        now += result.duration
        finished.extend(result.finished)
    return finished


def test_tgi_s_time_per_token_is_observed_per_finished_request() -> None:
    engine = _loaded_engine()
    registry = new_registry()
    metrics = EngineMetrics(registry, MetricsFlavor.TGI, list)
    finished = _finish(engine, 2)
    for request in finished:
        metrics.observe_finished(LLAMA_8B, request, FinishReason.LENGTH.value)
    expected = [
        (r.finished_at - r.scheduled_at) / r.output_tokens
        for r in finished
        if r.scheduled_at is not None
    ]
    count = registry.get_sample_value("tgi_request_mean_time_per_token_duration_count")
    total = registry.get_sample_value("tgi_request_mean_time_per_token_duration_sum")
    assert count == len(expected) == 2
    assert total == pytest.approx(sum(expected))


def test_llamacpp_counts_the_prompt_it_computed_and_the_time_it_took() -> None:
    engine = _loaded_engine()
    registry = new_registry()
    metrics = EngineMetrics(registry, MetricsFlavor.LLAMACPP, list)
    finished = _finish(engine, 1)
    for request in finished:
        metrics.observe_finished(LLAMA_8B, request, FinishReason.LENGTH.value)
    computed = sum(r.prompt_tokens - r.cached_tokens for r in finished)
    seconds = sum(
        r.first_token_at - r.scheduled_at
        for r in finished
        if r.first_token_at is not None and r.scheduled_at is not None
    )
    assert registry.get_sample_value("llamacpp:prompt_tokens_total") == computed
    assert registry.get_sample_value("llamacpp:prompt_seconds_total") == pytest.approx(seconds)

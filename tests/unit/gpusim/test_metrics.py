from __future__ import annotations

import dataclasses

import pytest

from gpusim.engine import Engine, EngineConfig, EngineRequest, FinishedRequest, FinishReason
from gpusim.metrics import EngineMetrics, MetricsFlavor, ModelSnapshot
from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry

M = "meta-llama/Llama-3.1-8B-Instruct"


def _engine() -> Engine:
    engine = Engine(
        get_profile("H100", LLAMA_8B), EngineConfig(degradation=Degradation(warmup_passes=0))
    )
    engine.add(EngineRequest("a", 40, 5), 0.0)
    engine.add(EngineRequest("b", 40, 5), 0.0)
    return engine


def _snapshot(engine: Engine) -> ModelSnapshot:
    return ModelSnapshot(M, engine.profile, engine.stats(), generation_throughput=42.0)


def test_vllm_names_are_read_from_the_engine_at_scrape_time() -> None:
    registry = new_registry()
    engine = _engine()
    EngineMetrics(registry, MetricsFlavor.VLLM, lambda: [_snapshot(engine)])
    label = {"model_name": M}
    assert registry.get_sample_value("vllm:num_requests_waiting", label) == 2.0
    step = engine.step(0.0)
    assert step is not None
    assert registry.get_sample_value("vllm:num_requests_running", label) == 2.0
    assert registry.get_sample_value("vllm:num_requests_waiting", label) == 0.0
    usage = registry.get_sample_value("vllm:kv_cache_usage_perc", label)
    assert usage is not None
    assert 0.0 < usage < 0.01
    assert registry.get_sample_value("vllm:prefix_cache_queries_total", label) == 80.0
    assert registry.get_sample_value("vllm:prefix_cache_hits_total", label) == 0.0
    assert registry.get_sample_value("vllm:prompt_tokens_total", label) == 80.0
    assert registry.get_sample_value("vllm:generation_tokens_total", label) == 2.0
    info = {
        "model_name": M,
        "block_size": "16",
        "num_gpu_blocks": str(engine.profile.num_gpu_blocks),
        "enable_prefix_caching": "True",
    }
    assert registry.get_sample_value("vllm:cache_config_info", info) == 1.0


def test_histograms_observe_steps_and_finished_requests() -> None:
    registry = new_registry()
    engine = _engine()
    metrics = EngineMetrics(registry, MetricsFlavor.VLLM, lambda: [_snapshot(engine)])
    label = {"model_name": M}
    first = engine.step(0.0)
    second = engine.step(0.0)
    assert first is not None
    assert second is not None
    metrics.observe_step(M, first)
    metrics.observe_step(M, second)
    assert registry.get_sample_value("vllm:time_to_first_token_seconds_count", label) == 2.0
    assert registry.get_sample_value("vllm:inter_token_latency_seconds_count", label) == 2.0
    itl_sum = registry.get_sample_value("vllm:inter_token_latency_seconds_sum", label)
    assert itl_sum == pytest.approx(2 * second.duration)
    done = FinishedRequest("a", FinishReason.LENGTH, 40, 0, 5, 0.0, 0.0, 0.1, 1.5, 0)
    metrics.observe_finished(M, done, "length")
    assert registry.get_sample_value("vllm:e2e_request_latency_seconds_sum", label) == 1.5
    assert registry.get_sample_value("vllm:request_queue_time_seconds_count", label) == 1.0
    assert (
        registry.get_sample_value(
            "vllm:request_success_total", {"model_name": M, "finished_reason": "length"}
        )
        == 1.0
    )


def test_sglang_flavor_uses_sglang_names() -> None:
    registry = new_registry()
    engine = _engine()
    stats = dataclasses.replace(engine.stats(), prefix_cache_queries=100, prefix_cache_hits=25)
    snap = dataclasses.replace(_snapshot(engine), stats=stats)
    EngineMetrics(registry, MetricsFlavor.SGLANG, lambda: [snap])
    label = {"model_name": M}
    assert registry.get_sample_value("sglang:num_queue_reqs", label) == 2.0
    assert registry.get_sample_value("sglang:num_running_reqs", label) == 0.0
    assert registry.get_sample_value("sglang:token_usage", label) == 0.0
    assert registry.get_sample_value("sglang:cache_hit_rate", label) == 0.25
    assert registry.get_sample_value("sglang:gen_throughput", label) == 42.0
    info = {"model_name": M, "page_size": "16", "num_pages": str(engine.profile.num_gpu_blocks)}
    assert registry.get_sample_value("sglang:cache_config_info", info) == 1.0
    assert registry.get_sample_value("vllm:num_requests_waiting", label) is None


def test_prefix_cache_size_gauge_is_bounded_by_the_kv_cache() -> None:
    registry = new_registry()
    engine = _engine()
    EngineMetrics(registry, MetricsFlavor.VLLM, lambda: [_snapshot(engine)])
    label = {"model_name": M}
    assert registry.get_sample_value("gtm_gpusim_prefix_cache_entries", label) == 0.0
    # Three caches' worth of distinct blocks: the index holds at most the KV cache's
    # blocks, the least recently released evicted first.
    pool = engine.pool
    batch = 4096
    for k in range(3 * pool.num_blocks // batch + 1):
        blocks = pool.allocate(min(batch, pool.num_free))
        assert blocks is not None
        for i, block in enumerate(blocks):
            pool.register(block, hash((k, i)))
        pool.release(blocks)
    assert pool.evictions > 0
    gauge = registry.get_sample_value("gtm_gpusim_prefix_cache_entries", label)
    assert gauge == pool.num_cached
    assert pool.num_blocks - batch <= pool.num_cached <= pool.num_blocks

from __future__ import annotations

from tests.unit.zone_agent.engines.helpers import parsed
from zone_agent.scrape import Flavor, ModelMetrics, parse_metrics

MODEL = "Qwen/Qwen3-0.6B"


def test_a_dynamo_frontend_is_read_running_as_inflight_minus_queued() -> None:
    metrics = parsed("dynamo_frontend", default_model=MODEL)
    assert metrics.flavor is Flavor.DYNAMO
    assert metrics.models[MODEL] == ModelMetrics(
        running=13.0,
        waiting=5.0,
        kv_usage=0.5,
        block_size=16,
        kv_blocks_total=5943,
        prefix_hits=262144.0,
        prefix_queries=1048576.0,
        itl_sum=655.36,
        itl_count=65536.0,
        ttft_sum=46.08,
        ttft_count=512.0,
        prompt_tokens_sum=1048576.0,
        cached_tokens=262144.0,
    )


def test_a_worker_s_handler_counts_only_its_generate_endpoint() -> None:
    text = (
        'dynamo_component_inflight_requests{dynamo_endpoint="generate",model="m"} 9\n'
        'dynamo_component_inflight_requests{dynamo_endpoint="load_lora",model="m"} 1\n'
        "dynamo_component_kvstats_gpu_cache_usage_percent 0.25\n"
        "dynamo_component_kvstats_total_blocks 5943\n"
    )
    model = parse_metrics(text, scraped_at=0.0, default_model="m").models["m"]
    assert (model.running, model.waiting, model.kv_usage, model.kv_blocks_total) == (
        9.0,
        0.0,
        0.25,
        5943,
    )

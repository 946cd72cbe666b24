from __future__ import annotations

from tests.unit.zone_agent.engines.helpers import parsed
from zone_agent.scrape import Flavor, ModelMetrics

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_a_vllm_worker_is_read_whole() -> None:
    metrics = parsed("vllm", default_model=MODEL)
    assert metrics.flavor is Flavor.VLLM
    assert metrics.models[MODEL] == ModelMetrics(
        running=12.0,
        waiting=3.0,
        kv_usage=0.4375,
        block_size=16,
        kv_blocks_total=29127,
        prefix_hits=40960.0,
        prefix_queries=81920.0,
        itl_sum=510.4,
        itl_count=25520.0,
        ttft_sum=6.4,
        ttft_count=80.0,
    )


def test_the_cache_config_without_a_model_label_counts_for_the_default_model_only() -> None:
    """vLLM's ``cache_config_info`` carries no ``model_name``: with no model to credit it
    to (a worker declared with several), the geometry stays on the unnamed row."""
    metrics = parsed("vllm")
    assert metrics.models[MODEL].block_size is None
    assert metrics.models[""].block_size == 16

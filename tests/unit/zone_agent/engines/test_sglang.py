from __future__ import annotations

from tests.unit.zone_agent.engines.helpers import parsed
from zone_agent.scrape import Flavor, ModelMetrics

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def test_an_sglang_worker_is_read_and_its_hit_rate_is_not_taken_for_counts() -> None:
    metrics = parsed("sglang")
    assert metrics.flavor is Flavor.SGLANG
    assert metrics.models[MODEL] == ModelMetrics(
        running=20.0,
        waiting=5.0,
        kv_usage=0.62,
        block_size=1,
        kv_blocks_total=400000,
        itl_sum=180.0,
        itl_count=10000.0,
    )
    assert metrics.models[MODEL].prefix_hits is None

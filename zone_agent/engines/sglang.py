"""SGLang's names (python/sglang/srt/metrics/collector.py).

``sglang:token_usage`` is the KV pool's used fraction; ``sglang:cache_config_info``
carries ``page_size`` and ``num_pages``. SGLang exports a prefix-cache hit *rate*
(``sglang:cache_hit_rate``), not hit and query counters, so prefix hits are absent.
"""

from __future__ import annotations

from types import MappingProxyType

from zone_agent.engines.base import ConfigInfo, EngineNames, Flavor

SGLANG = EngineNames(
    flavor=Flavor.SGLANG,
    samples=MappingProxyType(
        {
            "sglang:num_running_reqs": "running",
            "sglang:num_queue_reqs": "waiting",
            "sglang:token_usage": "kv_usage",
            "sglang:inter_token_latency_seconds_sum": "itl_sum",
            "sglang:inter_token_latency_seconds_count": "itl_count",
        }
    ),
    config_info=MappingProxyType(
        {"sglang:cache_config_info": ConfigInfo("page_size", "num_pages")}
    ),
)

"""SGLang's names (python/sglang/srt/metrics/collector.py).

``sglang:token_usage`` is the KV pool's used fraction; ``sglang:cache_config_info``
carries ``page_size`` and ``num_pages``. SGLang exports a prefix-cache hit *rate*
(``sglang:cache_hit_rate``), not hit and query counters, so prefix hits are absent.
Profile calibration reads TTFT less queue time as a request's prefill time, and
``sglang:prompt_tokens_total`` less ``sglang:cached_tokens_total`` as the tokens computed.
"""

from __future__ import annotations

from types import MappingProxyType

from zone_agent.engines.base import ConfigInfo, EngineNames, Flavor, LabelledFamily

SGLANG = EngineNames(
    flavor=Flavor.SGLANG,
    samples=MappingProxyType(
        {
            "sglang:num_running_reqs": "running",
            "sglang:num_queue_reqs": "waiting",
            "sglang:token_usage": "kv_usage",
            "sglang:inter_token_latency_seconds_sum": "itl_sum",
            "sglang:inter_token_latency_seconds_count": "itl_count",
            "sglang:time_to_first_token_seconds_sum": "ttft_sum",
            "sglang:time_to_first_token_seconds_count": "ttft_count",
            "sglang:queue_time_seconds_sum": "queue_time_sum",
            "sglang:prompt_tokens_total": "prompt_tokens_sum",
        }
    ),
    # Cached prompt tokens by where they were found; the device's spare prefill compute
    # (releases before the label have one unlabelled series).
    labelled=MappingProxyType(
        {
            "sglang:cached_tokens_total": LabelledFamily(
                "cache_source", MappingProxyType({"device": "cached_tokens", "": "cached_tokens"})
            )
        }
    ),
    config_info=MappingProxyType(
        {"sglang:cache_config_info": ConfigInfo("page_size", "num_pages")}
    ),
)

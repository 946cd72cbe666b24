"""vLLM's names (vllm/v1/metrics/loggers.py; GIE's model-server protocol reads the same).

``vllm:kv_cache_usage_perc`` is a fraction in [0, 1] despite its name; releases before
V1 call it ``vllm:gpu_cache_usage_perc``. Prefix-cache hits and queries count tokens.
``vllm:cache_config_info`` carries the KV geometry in its labels (``block_size``,
``num_gpu_blocks``). The inter-token latency histogram is
``vllm:inter_token_latency_seconds`` (before V1: ``time_per_output_token_seconds``).
Profile calibration reads the per-request histograms vLLM observes when a request
finishes: ``vllm:request_prefill_time_seconds``, ``vllm:request_prompt_tokens`` and
``vllm:request_prefill_kv_computed_tokens`` (prompt tokens less prefix-cache hits).
"""

from __future__ import annotations

from types import MappingProxyType

from zone_agent.engines.base import ConfigInfo, EngineNames, Flavor

VLLM = EngineNames(
    flavor=Flavor.VLLM,
    samples=MappingProxyType(
        {
            "vllm:num_requests_running": "running",
            "vllm:num_requests_waiting": "waiting",
            "vllm:kv_cache_usage_perc": "kv_usage",
            "vllm:gpu_cache_usage_perc": "kv_usage",
            "vllm:prefix_cache_hits_total": "prefix_hits",
            "vllm:prefix_cache_queries_total": "prefix_queries",
            "vllm:inter_token_latency_seconds_sum": "itl_sum",
            "vllm:inter_token_latency_seconds_count": "itl_count",
            "vllm:time_per_output_token_seconds_sum": "itl_sum",
            "vllm:time_per_output_token_seconds_count": "itl_count",
            "vllm:request_prefill_time_seconds_sum": "prefill_time_sum",
            "vllm:request_prefill_time_seconds_count": "prefill_time_count",
            "vllm:time_to_first_token_seconds_sum": "ttft_sum",
            "vllm:time_to_first_token_seconds_count": "ttft_count",
            "vllm:request_queue_time_seconds_sum": "queue_time_sum",
            "vllm:request_prompt_tokens_sum": "prompt_tokens_sum",
            "vllm:request_prefill_kv_computed_tokens_sum": "computed_tokens_sum",
        }
    ),
    config_info=MappingProxyType(
        {"vllm:cache_config_info": ConfigInfo("block_size", "num_gpu_blocks")}
    ),
)

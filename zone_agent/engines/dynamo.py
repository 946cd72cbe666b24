"""NVIDIA Dynamo's names (ai-dynamo/dynamo).

Sources: ``lib/runtime/src/metrics/prometheus_names.rs`` (every ``dynamo_*`` name: the
frontend's ``frontend_service`` names behind ``dynamo_frontend_``, the ``kvstats`` names
behind ``dynamo_component_kvstats_``) and ``docs/observability/metrics.md`` (what each
means; ``docs/observability/metrics_examples/`` holds scraped samples).

gtm routes to what serves the OpenAI API, which in Dynamo is the frontend
(``python -m dynamo.frontend``, ``/metrics`` on its HTTP port); workers behind it expose
``dynamo_component_*`` on their system port. Both are read:

* running — ``dynamo_frontend_inflight_requests`` minus ``dynamo_frontend_queued_requests``:
  inflight lasts from the HTTP handler's start to the response's end, queued until the
  first token (prefill included), so the difference is the requests decoding; a worker's
  ``dynamo_component_inflight_requests{dynamo_endpoint="generate"}`` (requests in its
  handler) where no frontend figure is there;
* waiting — ``dynamo_frontend_queued_requests``;
* KV usage — ``dynamo_component_kvstats_gpu_cache_usage_percent`` (a fraction, "0.0-1.0",
  despite its name), exposed by workers and by a KV-routing frontend;
* KV geometry — ``dynamo_frontend_model_kv_cache_block_size`` and
  ``dynamo_frontend_model_total_kv_blocks`` (or ``dynamo_component_kvstats_total_blocks``);
* prefix-cache hits and queries — ``dynamo_frontend_cached_tokens`` (cached prompt tokens
  per request) and ``dynamo_frontend_input_sequence_tokens`` (prompt tokens per request):
  their histogram sums are the token counters vLLM names ``prefix_cache_{hits,queries}``;
* inter-token latency — ``dynamo_frontend_inter_token_latency_seconds`` (histogram);
* for profile calibration — ``dynamo_frontend_time_to_first_token_seconds`` (TTFT) and
  the prompt and cached token sums above; no queue time is exported.

Frontend samples carry the served model in ``model``; ``kvstats`` samples carry none
and count for the model the worker serves.
"""

from __future__ import annotations

from types import MappingProxyType

from zone_agent.engines.base import EngineNames, Flavor, LabelledFamily, Row

_INFLIGHT = "_dynamo_inflight"
_HANDLER = "_dynamo_handler_inflight"


def _derive(row: Row) -> None:
    # The prompt and cached token sums are also what profile calibration reads.
    if row.get("prefix_queries") is not None:
        row["prompt_tokens_sum"] = row["prefix_queries"]
    if row.get("prefix_hits") is not None:
        row["cached_tokens"] = row["prefix_hits"]
    inflight = row.pop(_INFLIGHT, None)
    handler = row.pop(_HANDLER, None)
    queued = row.get("waiting")
    if inflight is not None:
        row["running"] = max(0.0, inflight - (queued or 0.0))
    elif handler is not None:
        row["running"] = handler
    for name in ("block_size", "kv_blocks_total"):
        value = row.get(name)
        row[name] = int(value) if value is not None and value >= 1 else None


DYNAMO = EngineNames(
    flavor=Flavor.DYNAMO,
    samples=MappingProxyType(
        {
            "dynamo_frontend_inflight_requests": _INFLIGHT,
            "dynamo_frontend_queued_requests": "waiting",
            "dynamo_component_kvstats_gpu_cache_usage_percent": "kv_usage",
            "dynamo_frontend_model_kv_cache_block_size": "block_size",
            "dynamo_frontend_model_total_kv_blocks": "kv_blocks_total",
            "dynamo_component_kvstats_total_blocks": "kv_blocks_total",
            "dynamo_frontend_cached_tokens_sum": "prefix_hits",
            "dynamo_frontend_input_sequence_tokens_sum": "prefix_queries",
            "dynamo_frontend_inter_token_latency_seconds_sum": "itl_sum",
            "dynamo_frontend_inter_token_latency_seconds_count": "itl_count",
            "dynamo_frontend_time_to_first_token_seconds_sum": "ttft_sum",
            "dynamo_frontend_time_to_first_token_seconds_count": "ttft_count",
        }
    ),
    labelled=MappingProxyType(
        {
            "dynamo_component_inflight_requests": LabelledFamily(
                "dynamo_endpoint", MappingProxyType({"generate": _HANDLER})
            )
        }
    ),
    model_label="model",
    derive=_derive,
)

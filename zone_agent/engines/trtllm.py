"""TensorRT-LLM's names behind Triton Inference Server's metrics endpoint.

Sources: the backend's metric groups in NVIDIA/TensorRT-LLM
``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc``
(family ``nv_trt_llm_request_metrics``, label ``request_type`` in active, max, scheduled,
context, waiting; family ``nv_trt_llm_kv_cache_block_metrics``, label
``kv_cache_block_type`` in max, free, used, tokens_per, reused, fraction; every sample
also labelled ``model`` and ``version``), the sample exposition in
triton-inference-server/tensorrtllm_backend ``README.md`` ("Triton Metrics"), and the
Gateway API Inference Extension's model-server protocol
(``docs/proposals/003-model-server-protocol/README.md``), which reads running as
``request_type="scheduled"``, waiting as ``request_type="waiting"`` and KV usage as
``kv_cache_block_type="fraction"``.

* KV usage — ``fraction``; releases before it (the README's sample has none) give
  ``used`` and ``max``, whose ratio is the same figure;
* KV geometry — ``tokens_per`` (tokens per block) and ``max`` (blocks);
* prefix-cache hits and queries — not exported (``reused`` counts blocks, not tokens
  asked for): absent;
* inter-token latency — not exported: Triton's ``nv_inference_*`` families time whole
  requests per Triton model (and, for an ensemble, its pre- and post-processing steps
  too), never a token; absent, so no throughput-regression check runs on this flavour;
* for profile calibration — ``nv_llm_input_token_len{response_metric_type=
  "total_input_tokens"}`` (a histogram of prompt tokens per request, same source file);
  no prefill or first-token time is exported.

The ``model`` label names Triton's model (``tensorrt_llm``), not the model the OpenAI API
serves, so it is not read as the model: the figures count for the one the worker serves.
"""

from __future__ import annotations

from types import MappingProxyType

from zone_agent.engines.base import EngineNames, Flavor, LabelledFamily, Row

_USED = "_trtllm_used_blocks"


def _derive(row: Row) -> None:
    used = row.pop(_USED, None)
    blocks = row.get("kv_blocks_total")
    if row.get("kv_usage") is None and used is not None and blocks:
        row["kv_usage"] = min(1.0, max(0.0, used / blocks))
    for name in ("block_size", "kv_blocks_total"):
        value = row.get(name)
        row[name] = int(value) if value is not None and value >= 1 else None


TRTLLM = EngineNames(
    flavor=Flavor.TRTLLM,
    labelled=MappingProxyType(
        {
            "nv_trt_llm_request_metrics": LabelledFamily(
                "request_type",
                MappingProxyType({"scheduled": "running", "waiting": "waiting"}),
            ),
            "nv_trt_llm_kv_cache_block_metrics": LabelledFamily(
                "kv_cache_block_type",
                MappingProxyType(
                    {
                        "fraction": "kv_usage",
                        "used": _USED,
                        "max": "kv_blocks_total",
                        "tokens_per": "block_size",
                    }
                ),
            ),
            "nv_llm_input_token_len_sum": LabelledFamily(
                "response_metric_type",
                MappingProxyType({"total_input_tokens": "prompt_tokens_sum"}),
            ),
        }
    ),
    model_label=None,
    derive=_derive,
)

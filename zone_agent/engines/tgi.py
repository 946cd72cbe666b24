"""Text Generation Inference's names (huggingface/text-generation-inference).

Sources: ``docs/source/reference/metrics.md`` (the metric table) and the code that sets
them: ``backends/v3/src/queue.rs`` (``tgi_queue_size``), ``backends/v3/src/backend.rs``
(``tgi_batch_current_size``, ``tgi_batch_current_max_tokens``), ``backends/v3/src/lib.rs``
(``tgi_batch_max_total_tokens``, set once after warm-up; ``tgi_batch_inference_duration``
by ``method``, one observation per prefill or decode call), ``router/src/server.rs``
(histogram buckets; ``/metrics`` is served on the API port and on ``--prometheus-port``).

What the router needs, and what TGI gives:

* running — ``tgi_batch_current_size`` (requests in the running batch);
* waiting — ``tgi_queue_size``;
* KV usage — not exported as a fraction. ``tgi_batch_current_max_tokens`` is the tokens
  the running batch has reserved (prompt plus ``max_new_tokens`` each, which TGI
  allocates up front) and ``tgi_batch_max_total_tokens`` the KV capacity in tokens, so
  the fraction is their ratio: an upper bound of what is written, which is what admission
  must respect. Absent when the capacity gauge is (v2 backends set no such gauge);
* KV geometry (block size, blocks), prefix-cache hits and queries — not exported: absent;
* inter-token latency — ``tgi_batch_inference_duration{method="decode"}``: one decode
  call produces a token for every running request, so its mean duration is the gap
  between tokens. (``tgi_request_mean_time_per_token_duration``, which TGI's table calls
  the inter-token latency, divides a request's whole inference time, prefill included,
  by its tokens: above the decode step by the prefill, so not read);
* for profile calibration — ``tgi_request_queue_duration`` (queue time) and
  ``tgi_request_input_length`` (prompt tokens), both per-request histograms; TGI times no
  request's prefill or first token (``tgi_batch_forward_duration{method="prefill"}`` times
  batches), so prefill time is absent.

No model label: a TGI server serves one model.
"""

from __future__ import annotations

from types import MappingProxyType

from zone_agent.engines.base import EngineNames, Flavor, LabelledFamily, Row

_RESERVED = "_tgi_reserved_tokens"
_CAPACITY = "_tgi_capacity_tokens"


def _derive(row: Row) -> None:
    reserved = row.pop(_RESERVED, None)
    capacity = row.pop(_CAPACITY, None)
    if reserved is not None and capacity is not None and capacity > 0:
        row["kv_usage"] = min(1.0, max(0.0, reserved / capacity))


TGI = EngineNames(
    flavor=Flavor.TGI,
    samples=MappingProxyType(
        {
            "tgi_batch_current_size": "running",
            "tgi_queue_size": "waiting",
            "tgi_batch_current_max_tokens": _RESERVED,
            "tgi_batch_max_total_tokens": _CAPACITY,
            "tgi_request_queue_duration_sum": "queue_time_sum",
            "tgi_request_input_length_sum": "prompt_tokens_sum",
        }
    ),
    labelled=MappingProxyType(
        {
            "tgi_batch_inference_duration_sum": LabelledFamily(
                "method", MappingProxyType({"decode": "itl_sum"})
            ),
            "tgi_batch_inference_duration_count": LabelledFamily(
                "method", MappingProxyType({"decode": "itl_count"})
            ),
        }
    ),
    model_label=None,
    derive=_derive,
)

"""llama.cpp server's names (``llama-server --metrics``; ggml-org/llama.cpp).

Sources: ``tools/server/README.md`` ("GET /metrics", the table of available metrics) and,
for releases before the server moved to ``tools/``, ``examples/server/README.md``, which
also lists ``llamacpp:kv_cache_usage_ratio`` ("1 means 100 percent usage") and
``llamacpp:kv_cache_tokens``; current releases no longer export those two.

* running — ``llamacpp:requests_processing`` (slots processing a request);
* waiting — ``llamacpp:requests_deferred`` (requests waiting for a slot);
* KV usage — ``llamacpp:kv_cache_usage_ratio`` where exported, else absent;
* KV geometry, prefix-cache hits and queries — not exported: absent;
* inter-token latency — ``llamacpp:tokens_predicted_seconds_total`` (generation time,
  summed over slots) over ``llamacpp:tokens_predicted_total`` (generated tokens): a
  counter pair with the meaning of a histogram's sum and count;
* for profile calibration — ``llamacpp:prompt_seconds_total`` (prompt processing time)
  and ``llamacpp:prompt_tokens_total`` (prompt tokens processed: a prefix the slot
  already holds is not processed again), the time and the tokens of the same prefills;
  no count of requests, so ``prefill_time_count`` is absent.

No model label: a llama.cpp server serves one model (in router mode, ``/metrics`` takes
``?model=``), so its figures count for the model the worker serves.
"""

from __future__ import annotations

from types import MappingProxyType

from zone_agent.engines.base import EngineNames, Flavor

LLAMACPP = EngineNames(
    flavor=Flavor.LLAMACPP,
    samples=MappingProxyType(
        {
            "llamacpp:requests_processing": "running",
            "llamacpp:requests_deferred": "waiting",
            "llamacpp:kv_cache_usage_ratio": "kv_usage",
            "llamacpp:tokens_predicted_seconds_total": "itl_sum",
            "llamacpp:tokens_predicted_total": "itl_count",
            "llamacpp:prompt_seconds_total": "prefill_time_sum",
            "llamacpp:prompt_tokens_total": "computed_tokens_sum",
        }
    ),
    model_label=None,
)

from __future__ import annotations

from tests.unit.zone_agent.engines.helpers import parsed
from zone_agent.scrape import Flavor, ModelMetrics, parse_metrics

MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def test_triton_s_labelled_families_are_matched_by_label() -> None:
    """Running is ``request_type="scheduled"`` (not ``active``), KV geometry comes from
    ``tokens_per`` and ``max``; Triton's ``model`` label (``tensorrt_llm``) is not the
    served model, and the ``nv_inference_*`` families of the ensemble's other steps
    are not read."""
    metrics = parsed("trtllm", default_model=MODEL)
    assert metrics.flavor is Flavor.TRTLLM
    assert set(metrics.models) == {MODEL}
    assert metrics.models[MODEL] == ModelMetrics(
        running=30.0,
        waiting=4.0,
        kv_usage=0.25,
        block_size=64,
        kv_blocks_total=6240,
        prompt_tokens_sum=655360.0,
    )


def test_a_release_without_the_fraction_gives_used_over_max() -> None:
    text = (
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm"} 10\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm"} 40\n'
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled"} 3\n'
    )
    model = parse_metrics(text, scraped_at=0.0, default_model=MODEL).models[MODEL]
    assert (model.kv_usage, model.kv_blocks_total, model.block_size) == (0.25, 40, None)


def test_no_inter_token_latency_is_exported() -> None:
    model = parsed("trtllm", default_model=MODEL).models[MODEL]
    assert (model.itl_sum, model.itl_count, model.prefix_hits) == (None, None, None)

from __future__ import annotations

from tests.unit.zone_agent.engines.helpers import parsed
from zone_agent.scrape import Flavor, ModelMetrics

MODEL = "ggml-org/Qwen3-8B-GGUF"


def test_a_current_llama_server_has_no_kv_usage_and_it_is_absent() -> None:
    metrics = parsed("llamacpp", default_model=MODEL)
    assert metrics.flavor is Flavor.LLAMACPP
    assert metrics.models[MODEL] == ModelMetrics(
        running=4.0,
        waiting=2.0,
        kv_usage=None,
        itl_sum=464.2,
        itl_count=23210.0,
        prefill_time_sum=37.44,
        computed_tokens_sum=96641.0,
    )


def test_an_older_llama_server_gives_its_kv_usage_ratio() -> None:
    model = parsed("llamacpp_examples_server", default_model=MODEL).models[MODEL]
    assert (model.running, model.waiting, model.kv_usage) == (1.0, 0.0, 0.75)
    assert (model.itl_sum, model.itl_count) == (50.0, 2000.0)

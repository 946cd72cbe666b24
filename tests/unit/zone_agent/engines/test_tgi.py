from __future__ import annotations

import pytest

from tests.unit.zone_agent.engines.helpers import parsed
from zone_agent.scrape import Flavor, ModelMetrics, parse_metrics

MODEL = "mistralai/Mistral-7B-Instruct-v0.3"


def test_a_tgi_server_is_read_for_the_model_it_serves() -> None:
    metrics = parsed("tgi", default_model=MODEL)
    assert metrics.flavor is Flavor.TGI
    assert set(metrics.models) == {MODEL}
    assert metrics.models[MODEL] == ModelMetrics(
        running=24.0,
        waiting=6.0,
        kv_usage=98304 / 393216,
        itl_sum=5000.0,
        itl_count=250000.0,
        queue_time_sum=41.0,
        prompt_tokens_sum=1536000.0,
    )


def test_the_inter_token_latency_is_the_decode_call_not_the_per_request_mean() -> None:
    """TGI's per-request mean time per token counts the prefill too (22.5 s over 1,000
    requests here); a decode call's duration is the gap between tokens."""
    model = parsed("tgi", default_model=MODEL).models[MODEL]
    assert model.itl_sum is not None
    assert model.itl_count is not None
    assert model.itl_sum / model.itl_count == 0.02


def test_what_tgi_does_not_export_is_absent_not_zero() -> None:
    model = parsed("tgi", default_model=MODEL).models[MODEL]
    assert (model.block_size, model.kv_blocks_total) == (None, None)
    assert (model.prefix_hits, model.prefix_queries) == (None, None)


@pytest.mark.parametrize(
    ("text", "usage"),
    [
        ("tgi_batch_current_size 2\ntgi_queue_size 0\ntgi_batch_current_max_tokens 10\n", None),
        ("tgi_batch_current_max_tokens 10\ntgi_batch_max_total_tokens 0\n", None),
        ("tgi_batch_current_max_tokens 900\ntgi_batch_max_total_tokens 600\n", 1.0),
    ],
    ids=["no capacity gauge (v2)", "zero capacity", "over-reserved"],
)
def test_kv_usage_needs_the_capacity_and_stays_a_fraction(text: str, usage: float | None) -> None:
    model = parse_metrics(text, scraped_at=0.0, default_model=MODEL).models[MODEL]
    assert model.kv_usage == usage

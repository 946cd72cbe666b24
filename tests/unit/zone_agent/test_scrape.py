from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from gpusim.engine import Engine
from gpusim.metrics import EngineMetrics, MetricsFlavor, ModelSnapshot
from gtm.clock import FakeClock
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry
from zone_agent.scrape import Flavor, ScrapeError, parse_metrics, scrape
from zone_agent.upstream import UpstreamPool


def _exposition(flavor: MetricsFlavor) -> str:
    """What an emulated worker serves on /metrics, in either flavour."""
    profile = get_profile("H100", LLAMA_8B)
    engine = Engine(profile)
    registry = new_registry()
    snapshot = ModelSnapshot(LLAMA_8B, profile, engine.stats(0.0), 0.0)
    EngineMetrics(registry, flavor, lambda: [snapshot])
    return generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("flavor", "expected"),
    [(MetricsFlavor.VLLM, Flavor.VLLM), (MetricsFlavor.SGLANG, Flavor.SGLANG)],
)
def test_parses_the_emulators_exposition(flavor: MetricsFlavor, expected: Flavor) -> None:
    profile = get_profile("H100", LLAMA_8B)
    parsed = parse_metrics(_exposition(flavor), scraped_at=5.0)
    assert parsed.flavor is expected
    model = parsed.models[LLAMA_8B]
    assert model.running == 0
    assert model.kv_usage == 0.0
    assert model.block_size == profile.block_size
    assert model.kv_blocks_total == profile.num_gpu_blocks
    assert parsed.age(7.5) == 2.5


VLLM_TEXT = """\
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:cache_config_info{block_size="32",model_name="m",num_gpu_blocks="100"} 1.0
vllm:inter_token_latency_seconds_sum{model_name="m"} 0.5
vllm:inter_token_latency_seconds_count{model_name="m"} 10.0
vllm:inter_token_latency_seconds_bucket{le="0.1",model_name="m"} 10.0
other_metric 7
"""


def test_reads_legacy_names_and_histogram_sums() -> None:
    model = parse_metrics(VLLM_TEXT, scraped_at=0.0).models["m"]
    assert (model.running, model.waiting, model.kv_usage) == (3.0, 2.0, 0.25)
    assert (model.block_size, model.kv_blocks_total) == (32, 100)
    assert (model.itl_sum, model.itl_count) == (0.5, 10.0)


def test_unlabelled_samples_go_to_the_default_model() -> None:
    text = "sglang:num_running_reqs 4\nsglang:token_usage 0.5\n"
    parsed = parse_metrics(text, scraped_at=0.0, default_model="only")
    assert parsed.models["only"].running == 4
    assert parsed.flavor is Flavor.SGLANG


@pytest.mark.parametrize(
    "text",
    [
        'vllm:num_requests_running{model_name="m"} not-a-number\n',
        'vllm:kv_cache_usage_perc{model_name="m"} 7\n',
        'vllm:num_requests_waiting{model_name="m"} -1\n',
        'vllm:num_requests_running{model_name="m" 3\n',
    ],
)
def test_garbage_is_a_scrape_error(text: str) -> None:
    with pytest.raises(ScrapeError):
        parse_metrics(text, scraped_at=0.0)


def test_bad_config_labels_are_ignored() -> None:
    text = 'vllm:cache_config_info{block_size="x",model_name="m",num_gpu_blocks="-3"} 1\n'
    model = parse_metrics(text, scraped_at=0.0).models["m"]
    assert model.block_size is None
    assert model.kv_blocks_total is None


async def test_unreachable_worker_is_a_scrape_error() -> None:
    pool = UpstreamPool()
    try:
        with pytest.raises(ScrapeError, match="failed"):
            await scrape(pool, "http://127.0.0.1:9", clock=FakeClock(), timeout_s=1.0)
    finally:
        await pool.close()

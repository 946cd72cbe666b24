"""Which engine a worker runs is read off its names, per scrape."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.zone_agent.engines.helpers import exposition, parsed
from zone_agent.engines import ENGINES, Flavor
from zone_agent.scrape import ModelMetrics, parse_metrics

FIELDS = {f.name for f in dataclasses.fields(ModelMetrics)}


@pytest.mark.parametrize(
    ("fixture", "flavor"),
    [
        ("vllm", Flavor.VLLM),
        ("sglang", Flavor.SGLANG),
        ("tgi", Flavor.TGI),
        ("trtllm", Flavor.TRTLLM),
        ("llamacpp", Flavor.LLAMACPP),
        ("llamacpp_examples_server", Flavor.LLAMACPP),
        ("dynamo_frontend", Flavor.DYNAMO),
    ],
)
def test_each_engine_is_detected_from_its_own_exposition(fixture: str, flavor: Flavor) -> None:
    assert parsed(fixture, default_model="m").flavor is flavor


def test_every_engine_has_a_flavour_and_every_table_names_real_fields() -> None:
    assert {e.flavor for e in ENGINES} == set(Flavor) - {Flavor.UNKNOWN}
    for engine in ENGINES:
        targets = set(engine.samples.values())
        targets |= {f for fam in engine.labelled.values() for f in fam.values.values()}
        assert {t for t in targets if not t.startswith("_")} <= FIELDS, engine.flavor
        assert engine.derive is not None or all(not t.startswith("_") for t in targets)


def test_a_dynamo_worker_passing_vllm_names_through_is_read_as_vllm_alone() -> None:
    """Two flavours' names on one worker: the one that fills more fields wins, and its
    figures are kept whole — never Dynamo's handler count blended with vLLM's queue."""
    metrics = parsed("dynamo_vllm_worker", default_model="Qwen/Qwen3-0.6B")
    assert metrics.flavor is Flavor.VLLM
    model = metrics.models["Qwen/Qwen3-0.6B"]
    assert (model.running, model.waiting, model.kv_usage) == (7.0, 2.0, 0.25)
    assert (model.prefix_hits, model.prefix_queries) == (4000.0, 10000.0)


def test_a_tie_goes_to_the_engine_before_the_wrapper() -> None:
    text = "dynamo_frontend_queued_requests 3\nllamacpp:requests_deferred 4\n"
    assert parse_metrics(text, scraped_at=0.0).flavor is Flavor.LLAMACPP


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# HELP process_cpu_seconds_total CPU time.\nprocess_cpu_seconds_total 12.5\n",
        "ollama_requests_in_flight 3\n",
    ],
    ids=["empty", "process metrics only", "an engine gtm does not know"],
)
def test_an_unknown_worker_is_unknown_with_no_models(text: str) -> None:
    metrics = parse_metrics(text, scraped_at=2.0, default_model="m")
    assert metrics.flavor is Flavor.UNKNOWN
    assert dict(metrics.models) == {}


def test_the_line_filter_keeps_no_histogram_buckets() -> None:
    from zone_agent import scrape

    kept = scrape._relevant(exposition("dynamo_frontend"))
    assert "_bucket" not in kept
    assert "dynamo_frontend_inter_token_latency_seconds_sum" in kept

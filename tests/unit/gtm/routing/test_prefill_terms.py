"""gtm.routing.cost.prefill_terms: a place is priced by the GPU that would take a request
— its fastest free GPU, else its pooled backlog at its average rate — and a summary
without GPU classes (from before they existed) is priced exactly as before."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gtm.models import GpuClassLoad, ModelLoad, RegionSummary, merge_classes, taking_free
from gtm.routing.cost import PrefillTerms, prefill_options, prefill_terms

MODEL = "m"


def gpu_class(name: str, gpus: int, per_gpu: float, free: int = 0, queued: int = 0) -> GpuClassLoad:
    return GpuClassLoad(
        gpu_class=name,
        healthy_gpus=gpus,
        prefill_tokens_per_s=gpus * per_gpu,
        free_gpus=free,
        queued_prefill_tokens=queued,
    )


def load(*classes: GpuClassLoad, queued: int = 0, keep_classes: bool = True) -> ModelLoad:
    gpus = sum(c.healthy_gpus for c in classes)
    return ModelLoad(
        model=MODEL,
        gpus=gpus,
        healthy_gpus=gpus,
        prefill_tokens_per_s=math.fsum(c.prefill_tokens_per_s for c in classes),
        queued_prefill_tokens=queued,
        max_running_requests=64 * gpus,
        classes=tuple(classes) if keep_classes else (),
    )


def test_an_idle_fast_gpu_prices_the_place_whatever_its_slower_neighbours() -> None:
    # An H100-like GPU (20,000 tokens/s) beside three L4-like ones (2,000 tokens/s), all idle.
    mixed = load(gpu_class("fast", 1, 20_000.0, free=1), gpu_class("slow", 3, 2_000.0, free=3))
    assert prefill_options(mixed) == (
        PrefillTerms(0.0, 1, 20_000.0),
        PrefillTerms(0.0, 4, 26_000.0),
    )
    assert prefill_terms(mixed) == PrefillTerms(0.0, 1, 20_000.0)
    assert prefill_terms(mixed).ms_per_token == 0.05
    # Priced by the average instead, a prompt would cost 1000 · 4 / 26,000 ms a token.
    old = load(*mixed.classes, keep_classes=False)
    assert prefill_options(old) == (PrefillTerms(0.0, 4, 26_000.0),)
    assert prefill_terms(old) == PrefillTerms(0.0, 4, 26_000.0)


def test_requests_sent_since_the_summary_take_the_free_gpus_fastest_first() -> None:
    mixed = load(
        gpu_class("fast", 2, 20_000.0, free=1),
        gpu_class("slow", 3, 2_000.0, free=2),
        queued=9_000,
    )
    pooled = PrefillTerms(1000.0 * 9_000 / 46_000.0, 5, 46_000.0)
    assert prefill_options(mixed, unseen_requests=0.5) == (PrefillTerms(0.0, 2, 40_000.0), pooled)
    assert prefill_terms(mixed, unseen_requests=0.5) == PrefillTerms(0.0, 2, 40_000.0)
    # The fast GPU taken, a slow one is free: faster to start at once for short prompts,
    # after the backlog on an average GPU for long ones.
    slow_now = PrefillTerms(0.0, 3, 6_000.0)
    assert prefill_options(mixed, unseen_requests=1) == (slow_now, pooled)
    assert prefill_options(mixed, unseen_requests=2.5) == (slow_now, pooled)
    # One line for every prompt size: the free GPU only when no slower than the average.
    assert prefill_terms(mixed, unseen_requests=1) == pooled
    # Every free GPU taken: the pooled backlog, with what was sent since, at the average.
    assert prefill_options(mixed, unseen_requests=3, unseen_tokens=1_000) == (
        PrefillTerms(1000.0 * 10_000 / 46_000.0, 5, 46_000.0),
    )


def test_nothing_to_prefill_on_is_infinite() -> None:
    none = ModelLoad(model=MODEL, gpus=2, healthy_gpus=0, prefill_tokens_per_s=0.0)
    assert prefill_options(none) == (PrefillTerms(math.inf, 0, 0.0),)
    assert prefill_terms(none) == PrefillTerms(math.inf, 0, 0.0)
    assert prefill_terms(none).ms_per_token == 0.0


@given(
    gpus=st.integers(1, 64),
    rate=st.floats(1.0, 1e6),
    queued=st.integers(0, 10**7),
    unseen=st.integers(0, 100),
    tokens=st.integers(0, 10**6),
)
def test_a_summary_without_classes_is_priced_as_before_to_the_bit(
    gpus: int, rate: float, queued: int, unseen: int, tokens: int
) -> None:
    old = ModelLoad(
        model=MODEL,
        gpus=gpus,
        healthy_gpus=gpus,
        prefill_tokens_per_s=rate,
        queued_prefill_tokens=queued,
    )
    (only,) = prefill_options(old, unseen_requests=unseen, unseen_tokens=tokens)
    assert prefill_terms(old, unseen_requests=unseen, unseen_tokens=tokens) == only
    queue_ms, n, r = only
    assert queue_ms == 1000.0 * (queued + tokens) / rate
    assert (n, r) == (gpus, rate)
    assert PrefillTerms(queue_ms, n, r).ms_per_token == 1000.0 * gpus / rate


def test_an_old_summary_still_parses() -> None:
    raw = (
        b'{"schema": 1, "region_id": "eu-west", "published_at": 1.0, "models": [{"model": "m",'
        b' "gpus": 2, "healthy_gpus": 2, "prefill_tokens_per_s": 4000.0}]}'
    )
    summary = RegionSummary.model_validate_json(raw)
    found = summary.load_for("m")
    assert found is not None
    assert found.classes == ()
    again = RegionSummary.model_validate_json(summary.to_json())
    assert again == summary


def test_classes_are_checked() -> None:
    with pytest.raises(ValidationError, match="free_gpus"):
        gpu_class("a", 1, 1_000.0, free=2)
    with pytest.raises(ValidationError, match="fastest first"):
        load(gpu_class("slow", 1, 1_000.0), gpu_class("fast", 1, 9_000.0))
    with pytest.raises(ValidationError, match="cannot exceed healthy_gpus"):
        ModelLoad(
            model=MODEL,
            gpus=1,
            healthy_gpus=1,
            prefill_tokens_per_s=1.0,
            classes=(gpu_class("a", 2, 1.0),),
        )


def test_merging_and_taking_free_gpus() -> None:
    zone_a = (gpu_class("H100", 1, 20_000.0, free=1), gpu_class("L4", 1, 2_000.0, free=1))
    zone_b = (gpu_class("A100", 2, 10_000.0, free=0, queued=500), gpu_class("L4", 1, 2_000.0))
    merged = merge_classes([zone_a, zone_b])
    assert [(c.gpu_class, c.healthy_gpus, c.free_gpus) for c in merged] == [
        ("H100", 1, 1),
        ("A100", 2, 0),
        ("L4", 2, 1),
    ]
    assert merged[1].queued_prefill_tokens == 500
    assert taking_free(zone_a, 0) is zone_a
    assert [c.free_gpus for c in taking_free(zone_a, 1)] == [0, 1]
    assert [c.free_gpus for c in taking_free(zone_a, 5)] == [0, 0]

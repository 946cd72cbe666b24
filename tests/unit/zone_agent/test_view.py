from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from gtm.gpu_profiles import BGE_LARGE, LLAMA_8B, PROFILES, ModelKind, get_profile, gpu_types
from gtm.models import WorkerState
from zone_agent.accounting import Accounting, SlotLoad
from zone_agent.health import HealthStatus
from zone_agent.scrape import Flavor, GpuMetrics
from zone_agent.view import (
    RING_VNODES,
    ModelIndex,
    ViewBuilder,
    ViewSettings,
    _ring,
    _ring_of,
    _vnodes,
    profile_for,
    ring_lookup,
    trusted,
)

from .helpers import NOW, Gpu, make_view, state


def test_models_are_indexed_and_gpus_sorted_by_id() -> None:
    view = make_view(
        [Gpu("b", models=(LLAMA_8B, BGE_LARGE)), Gpu("a"), Gpu("c", models=(BGE_LARGE,))]
    )
    assert [g.id for g in view.gpus] == ["a", "b", "c"]
    assert view.by_model[LLAMA_8B].ids == ("a", "b")
    assert view.by_model[BGE_LARGE].ids == ("b", "c")
    assert view.models == (BGE_LARGE, LLAMA_8B)
    assert view.gpu("c") is not None
    assert view.gpu("zz") is None


def test_models_come_from_metrics_when_the_record_has_none() -> None:
    view = make_view([Gpu("a", models=(), running=0.0, metrics_models=(LLAMA_8B,))])
    assert view.by_model[LLAMA_8B].ids == ("a",)


@pytest.mark.parametrize(
    ("gpu", "reason"),
    [
        (Gpu("a", drained=True), "drained by an operator"),
        (Gpu("a", state=WorkerState.DRAINING), "worker is draining"),
        (Gpu("a", state=WorkerState.STARTING), "worker is starting"),
        (Gpu("a", health=HealthStatus(False, "ejected (outlier)")), "ejected (outlier)"),
        (Gpu("a"), None),
    ],
)
def test_unavailable_reasons(gpu: Gpu, reason: str | None) -> None:
    index = make_view([gpu]).by_model[LLAMA_8B]
    assert index.reasons == (reason,)
    assert bool(index.available[0]) is (reason is None)
    assert index.any_unavailable is (reason is not None)


def test_fresh_scrapes_are_used_and_stale_ones_distrusted() -> None:
    fresh = Gpu("a", running=4, waiting=3, kv_usage=0.5, kv_blocks=1000, block_size=16)
    stale = Gpu("b", running=4, waiting=3, kv_usage=0.5, scraped_age=5.0)
    index = make_view([fresh, stale]).by_model[LLAMA_8B]
    assert list(index.fresh) == [True, False]
    assert index.kv_total[0] == 1000
    assert index.kv_free_scraped[0] == 500
    assert math.isnan(index.kv_free_scraped[1])
    assert index.kv_free_base[1] == index.kv_total[1]
    assert index.running[1] == 0
    assert index.waiting[1] == 0
    assert index.external_queued[0] > 0
    assert index.external_queued[1] == 0


def test_external_queue_excludes_our_own_waiting_requests() -> None:
    gpu = Gpu("a", running=1, waiting=3, own_at_scrape=SlotLoad(prefilling=3))
    assert make_view([gpu]).by_model[LLAMA_8B].external_queued[0] == 0


@pytest.mark.parametrize(
    ("measured", "per_request"),
    [
        ((), 1024.0),  # nothing measured yet: the settings' guess
        (((LLAMA_8B, 15.0),), 15.0),  # the model's own series
        ((("", 300.0),), 300.0),  # an unlabelled series: the worker's one model
        (((BGE_LARGE, 9.0), ("", 300.0)), 300.0),  # another model's does not count
        (((LLAMA_8B, 0.0),), 0.0),  # every prompt came from the prefix cache
    ],
)
def test_other_clients_waiting_requests_weigh_what_the_worker_measured(
    measured: tuple[tuple[str, float], ...], per_request: float
) -> None:
    # Four requests wait at the worker, one of them the agent's: three of others.
    gpu = Gpu(
        "a", running=1, waiting=4, own_at_scrape=SlotLoad(prefilling=1), prompt_tokens=measured
    )
    assert make_view([gpu]).by_model[LLAMA_8B].external_queued[0] == 3 * per_request


def test_health_weight_scales_the_prefill_rate() -> None:
    index = make_view([Gpu("a", health=HealthStatus(True, weight=0.5))]).by_model[LLAMA_8B]
    rate = get_profile("H100", LLAMA_8B).prefill_tokens_per_s
    assert index.rate[0] == pytest.approx(rate / 2)
    assert index.ms_per_token[0] == pytest.approx(2000 / rate)


def test_the_slow_start_ramp_is_a_column_of_its_own() -> None:
    health = HealthStatus(True, weight=0.25, ramp=0.5)  # half ramp, half throttle
    index = make_view([Gpu("a", health=health), Gpu("b")]).by_model[LLAMA_8B]
    assert index.ramp.tolist() == [0.5, 1.0]
    assert index.weight.tolist() == [0.25, 1.0]


def test_an_unknown_gpu_type_is_priced_by_the_slowest_profile_of_its_model() -> None:
    slowest = min(
        (get_profile(gpu, LLAMA_8B) for gpu in gpu_types()), key=lambda p: p.prefill_tokens_per_s
    )
    prior = profile_for("TPU-v5", LLAMA_8B)
    assert (prior.gpu_type, prior.model) == ("TPU-v5", LLAMA_8B)  # declared, not another's
    assert prior.prefill_tokens_per_s == slowest.prefill_tokens_per_s
    assert prior.weight_read_s == slowest.weight_read_s
    # An unknown model too: the slowest generative profile gtm ships.
    other = profile_for("tpu", "some/other-model")
    assert other.model == "some/other-model"
    assert all(
        other.prefill_tokens_per_s <= p.prefill_tokens_per_s
        for p in PROFILES.values()
        if p.kind is ModelKind.GENERATE
    )


def test_context_limit_follows_the_workers_kv_geometry() -> None:
    index = make_view([Gpu("a", running=0, kv_blocks=100, block_size=16)]).by_model[LLAMA_8B]
    assert index.max_model_len[0] == 1600


def test_loaded_is_false_only_when_a_fresh_scrape_names_other_models() -> None:
    view = make_view(
        [
            Gpu("a", running=0, metrics_models=("other",)),
            Gpu("b", running=0, metrics_models=("other",), scraped_age=9.0),
            Gpu("c", running=0, metrics_models=("",)),
        ]
    )
    assert list(view.by_model[LLAMA_8B].loaded) == [False, True, True]


def test_arrays_are_read_only() -> None:
    index = make_view([Gpu("a")]).by_model[LLAMA_8B]
    with pytest.raises(ValueError, match="read-only"):
        index.rate[0] = 1.0


def test_ring_covers_every_gpu_and_lookup_wraps() -> None:
    index = make_view([Gpu(f"g{i}") for i in range(5)]).by_model[LLAMA_8B]
    assert set(np.unique(index.ring_owner).tolist()) == set(range(5))
    assert ring_lookup(index, 2**64 - 1) in (0, len(index.ring_points) - 1)
    assert ring_lookup(index, 0) == 0


def test_wrr_weights_follow_prefill_speed() -> None:
    index = make_view([Gpu("a", gpu_type="H100"), Gpu("b", gpu_type="A100-80GB")]).by_model[
        LLAMA_8B
    ]
    assert list(index.wrr_weight) == [2, 1]


def test_built_at() -> None:
    assert make_view([]).built_at == NOW


@pytest.mark.parametrize("count", [0, 1, 7, 300])
def test_the_ring_made_from_each_gpus_points_is_the_reference_ring(count: int) -> None:
    rng = random.Random(count)
    ids = sorted({f"gpu-{rng.randrange(10**6)}-{rng.choice('abc')}" for _ in range(count)})
    fast, reference = _ring_of([_vnodes(i) for i in ids]), _ring(ids)
    assert np.array_equal(fast[0], reference[0])
    assert np.array_equal(fast[1], reference[1])
    assert len(fast[0]) == RING_VNODES * len(ids)


def test_ring_ties_keep_position_order_as_the_reference_does() -> None:
    # Two GPUs whose points coincide (a forced tie): the earlier position first.
    same = _vnodes("gpu-a")
    points, owners = _ring_of([same, same.copy()])
    assert np.array_equal(points, np.repeat(np.sort(same), 2))
    assert owners.tolist() == [0, 1] * RING_VNODES


def _zone(count: int) -> list[Gpu]:
    rng = random.Random(count)
    types = ("H100", "A100-80GB", "L40S", "L4")
    return [
        Gpu(
            f"gpu-{i:03d}",
            gpu_type=types[i % len(types)],
            models=(LLAMA_8B, BGE_LARGE) if i % 5 == 0 else (LLAMA_8B,),
            running=float(rng.randrange(0, 64)) if i % 7 else None,
            waiting=float(rng.randrange(0, 8)),
            kv_usage=rng.random(),
            scraped_age=rng.choice((0.1, 2.0)),
            drained=i % 11 == 0,
            labels=(("canary", "true"),) if i % 13 == 0 else (("version", f"v{i % 3}"),),
        )
        for i in range(count)
    ]


def _same_index(a: ModelIndex, b: ModelIndex) -> None:
    for f in dataclasses.fields(ModelIndex):
        if f.name == "memo":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        else:
            assert x == y, f.name


def test_a_view_built_in_slices_is_the_view_built_at_once() -> None:
    acc = Accounting()
    states = [state(g, acc) for g in _zone(150)]
    settings = ViewSettings(stale_after_s=1.0)
    whole = ViewBuilder("zone-a", "region-1", settings).build(states, acc, NOW)
    steps = ViewBuilder("zone-a", "region-1", settings).steps(states, acc, NOW, step=16)
    slices = 0
    while True:
        try:
            next(steps)
            slices += 1
        except StopIteration as done:
            sliced = done.value
            break
    # 180 (model, GPU) entries 16 at a time, and 150 new GPUs' ring points to hash.
    assert slices >= 180 // 16
    assert [g.id for g in sliced.gpus] == [g.id for g in whole.gpus]
    assert sliced.models == whole.models == (BGE_LARGE, LLAMA_8B)
    for model in whole.models:
        _same_index(sliced.by_model[model], whole.by_model[model])


@pytest.mark.parametrize("at", [0, 5, 77, 149])
def test_a_view_with_one_gpu_replaced_is_the_view_built_anew(at: int) -> None:
    """An ejection's view (``with_gpu``: one GPU's entry gathered again) equals a build of
    the same states at the view's time: every column of every index, the derived ones
    too. GPU 0 and 5 serve two models, 77 one (an L40S), 149 is the last."""
    acc = Accounting()
    states = [state(g, acc) for g in _zone(150)]
    builder = ViewBuilder("zone-a", "region-1", ViewSettings(stale_after_s=1.0))
    view = builder.build(states, acc, NOW)
    old = view.gpus[at]
    ejected = dataclasses.replace(
        old, health=HealthStatus(False, "ejected (outlier) until t=40.0", weight=0.5, ramp=0.5)
    )
    patched = builder.with_gpu(view, ejected)
    rebuilt = builder.build([*states[:at], ejected, *states[at + 1 :]], acc, NOW)
    assert patched.gpus == rebuilt.gpus
    assert patched.models == rebuilt.models
    for model in rebuilt.models:
        _same_index(patched.by_model[model], rebuilt.by_model[model])
    index = patched.by_model[LLAMA_8B]
    assert not index.available[index.ids.index(old.id)]
    # The view it came from is untouched, and the other GPUs' states are shared.
    assert view.gpus[at] is old
    assert view.by_model[LLAMA_8B].available[index.ids.index(old.id)] == (
        old.unavailable_reason() is None
    )
    kept = zip(view.gpus, patched.gpus, strict=True)
    assert all(a is b for i, (a, b) in enumerate(kept) if i != at)


def test_a_gpu_not_in_the_view_or_serving_other_models_is_refused() -> None:
    acc = Accounting()
    builder = ViewBuilder("zone-a", "region-1")
    view = builder.build([state(Gpu("a"), acc)], acc, NOW)
    with pytest.raises(KeyError):
        builder.with_gpu(view, state(Gpu("b"), acc))
    with pytest.raises(ValueError, match="other models"):
        builder.with_gpu(view, state(Gpu("a", models=(BGE_LARGE,)), acc))


def test_a_gpu_is_hashed_onto_the_ring_once_and_forgotten_when_it_leaves() -> None:
    acc = Accounting()
    builder = ViewBuilder("zone-a", "region-1")
    gpus = [state(Gpu(f"gpu-{i}"), acc) for i in range(4)]
    first = builder.build(gpus, acc, NOW).by_model[LLAMA_8B]
    kept = builder._vnodes["gpu-1"]
    second = builder.build(gpus[1:], acc, NOW).by_model[LLAMA_8B]  # gpu-0 left
    assert builder._vnodes["gpu-1"] is kept
    assert set(builder._vnodes) == {"gpu-1", "gpu-2", "gpu-3"}
    assert np.array_equal(second.ring_points, _ring(second.ids)[0])
    assert len(first.ring_points) == 4 * RING_VNODES


def test_a_scrape_is_trusted_up_to_its_staleness_bound_and_not_after() -> None:
    settings = ViewSettings(stale_after_s=1.0)
    scraped = GpuMetrics(NOW - 1.0, Flavor.VLLM)
    assert trusted(scraped, NOW, settings)
    assert not trusted(scraped, NOW + 0.001, settings)
    assert not trusted(None, NOW, settings)

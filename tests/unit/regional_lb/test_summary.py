from __future__ import annotations

import pytest

from gtm.models import Endpoint, GpuClassLoad, ModelLoad
from regional_lb.summary import RateMeter, build_summary
from regional_lb.view import ZoneAccounting
from tests.unit.regional_lb.helpers import MODEL, NOW, model_load, view, zone


def test_the_summary_aggregates_healthy_undrained_zones() -> None:
    regional = view(
        [
            zone("a", model_load(gpus=2, running=4, max_running=16, queued=1_000, rate=10_000.0)),
            zone("b", model_load(gpus=2, healthy=0, running=0, max_running=16)),
            zone("c", model_load(gpus=4), drained=True),
        ]
    )
    accounting = ZoneAccounting()
    accounting.observe(regional.zones)
    accounting.start("a", MODEL, 500)
    summary = build_summary(
        regional,
        accounting,
        published_at=NOW,
        spill_in_per_s=1.5,
        spill_out_per_s=0.5,
        endpoints=(Endpoint(url="http://lb"),),
    )
    (load,) = summary.models
    assert (load.gpus, load.healthy_gpus) == (4, 2)  # the drained zone is not capacity
    assert load.running_requests == 5  # 4 reported + 1 we sent since
    assert load.queued_prefill_tokens == 1_500
    assert load.max_running_requests == 16
    assert summary.ttft_for(MODEL) == pytest.approx(2.0 + 150.0)
    assert summary.saturated_models == ()
    assert summary.saturation == pytest.approx(5 / (16 + 5 * 2))
    assert (summary.zones_total, summary.zones_healthy) == (3, 2)
    assert summary.healthy
    assert (summary.spill_in_per_s, summary.spill_out_per_s) == (1.5, 0.5)
    assert summary.endpoints[0].url == "http://lb"


def test_a_full_region_lists_its_saturated_models() -> None:
    regional = view([zone("a", model_load(running=16, waiting=10)), zone("b", healthy=False)])
    summary = build_summary(regional, None, published_at=NOW)
    assert summary.saturated_models == (MODEL,)
    assert summary.saturation == 1.0
    empty = build_summary(view([]), None, published_at=NOW)
    assert not empty.healthy
    assert empty.saturation == 1.0
    drained = build_summary(view([zone("a")], drained=True), None, published_at=NOW)
    assert not drained.healthy


def test_rate_meter_counts_a_sliding_window() -> None:
    meter = RateMeter(window_s=10)
    for t in range(20):
        meter.add(float(t), 2)
    assert meter.rate(19.5) == pytest.approx(2.0)
    assert meter.rate(100.0) == 0.0
    with pytest.raises(ValueError, match="window_s"):
        RateMeter(0)


def test_the_summary_carries_the_zones_gpu_classes_after_what_was_sent_since() -> None:
    def zone_load(fast_free: int, slow_free: int) -> ModelLoad:
        classes = (
            GpuClassLoad(
                gpu_class="H100", healthy_gpus=1, prefill_tokens_per_s=20_000.0, free_gpus=fast_free
            ),
            GpuClassLoad(
                gpu_class="L4",
                healthy_gpus=2,
                prefill_tokens_per_s=6_000.0,
                free_gpus=slow_free,
                queued_prefill_tokens=300,
            ),
        )
        return ModelLoad(
            model=MODEL,
            gpus=3,
            healthy_gpus=3,
            prefill_tokens_per_s=26_000.0,
            queued_prefill_tokens=300,
            max_running_requests=48,
            classes=classes,
        )

    regional = view([zone("a", zone_load(1, 1)), zone("b", zone_load(1, 0))])
    accounting = ZoneAccounting()
    accounting.observe(regional.zones)
    accounting.start("a", MODEL, 500)  # takes zone a's free H100
    summary = build_summary(regional, accounting, published_at=NOW)
    (load,) = summary.models
    h100, l4 = load.classes
    assert (h100.gpu_class, h100.healthy_gpus, h100.free_gpus) == ("H100", 2, 1)
    assert (l4.gpu_class, l4.healthy_gpus, l4.free_gpus, l4.queued_prefill_tokens) == (
        "L4",
        4,
        1,
        600,
    )
    # Zone b's H100 is free: a request with nothing to prefill starts at once there.
    assert summary.ttft_for(MODEL) == 2.0

from __future__ import annotations

import pytest

from gtm.gpu_profiles import get_profile
from zone_agent.accounting import Accounting
from zone_agent.health import HealthStatus
from zone_agent.summary import build_summary

from .helpers import MODEL, Gpu, make_view


def test_per_model_capacity_counts_only_available_gpus() -> None:
    acc = Accounting()
    view = make_view(
        [
            Gpu("a", running=3.0, waiting=1.0, kv_usage=0.5, kv_blocks=1000),
            Gpu("b", gpu_type="A100-80GB"),
            Gpu("c", health=HealthStatus(False, "ejected")),
        ],
        acc,
    )
    acc.start("b", prefill_tokens=700, prefix_hashes=(5, 6, 7), prefix_capacity=10)
    summary = build_summary(view, published_at=123.0)
    load = summary.load_for(MODEL)
    assert load is not None
    assert (load.gpus, load.healthy_gpus) == (3, 2)
    rates = [get_profile(t, MODEL).prefill_tokens_per_s for t in ("H100", "A100-80GB")]
    assert load.prefill_tokens_per_s == pytest.approx(sum(rates))
    assert load.queued_prefill_tokens == 700 + 1024  # ours + one queued request elsewhere
    assert load.running_requests == 3 + 1
    assert load.waiting_requests == 1
    assert load.kv_blocks_free <= load.kv_blocks_total
    assert load.decode_tokens_per_s > 0
    assert summary.healthy
    assert summary.prefix_sketch[:2] == (5, 6)
    assert (summary.zone_id, summary.region_id, summary.published_at) == (
        "zone-a",
        "region-1",
        123.0,
    )


def test_later_summaries_of_one_view_see_the_charges_made_since() -> None:
    acc = Accounting()
    view = make_view([Gpu("a", kv_blocks=1000), Gpu("b")], acc)
    first = build_summary(view, published_at=1.0).load_for(MODEL)
    acc.start("a", prefill_tokens=900, kv_blocks=40.0)
    second = build_summary(view, published_at=2.0).load_for(MODEL)
    assert first is not None
    assert second is not None
    assert second.queued_prefill_tokens == first.queued_prefill_tokens + 900
    assert second.running_requests == first.running_requests + 1
    assert second.kv_blocks_free == first.kv_blocks_free - 40
    # What only a new view can change is the same.
    assert (
        second.model_copy(
            update={
                "queued_prefill_tokens": first.queued_prefill_tokens,
                "running_requests": first.running_requests,
                "kv_blocks_free": first.kv_blocks_free,
                "classes": first.classes,
            }
        )
        == first
    )
    # The charge made GPU a busy: one of the two H100s is free now, and queues 900 tokens.
    (before,), (after,) = first.classes, second.classes
    assert (before.free_gpus, after.free_gpus) == (2, 1)
    assert after.queued_prefill_tokens == before.queued_prefill_tokens + 900
    assert after.kv_blocks_free == before.kv_blocks_free - 40


def test_classes_break_the_available_gpus_down_fastest_first() -> None:
    acc = Accounting()
    view = make_view(
        [
            Gpu("a", gpu_type="L4"),
            Gpu("b", gpu_type="H100", running=0.0, waiting=2.0),
            Gpu("c", gpu_type="H100"),
            Gpu("d", gpu_type="L4", health=HealthStatus(False, "ejected")),
        ],
        acc,
    )
    load = build_summary(view, published_at=1.0).load_for(MODEL)
    assert load is not None
    h100, l4 = load.classes
    assert (h100.gpu_class, h100.healthy_gpus, h100.free_gpus) == ("H100", 2, 1)
    assert (l4.gpu_class, l4.healthy_gpus, l4.free_gpus) == ("L4", 1, 1)
    assert h100.prefill_tokens_per_s == pytest.approx(
        2 * get_profile("H100", MODEL).prefill_tokens_per_s
    )
    assert h100.ms_per_token < l4.ms_per_token
    assert h100.queued_prefill_tokens == load.queued_prefill_tokens > 0
    assert sum(c.healthy_gpus for c in load.classes) == load.healthy_gpus


def test_no_available_gpu_is_an_unhealthy_zone() -> None:
    view = make_view([Gpu("a", drained=True)])
    assert not build_summary(view, 0.0).healthy

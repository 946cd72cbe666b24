from __future__ import annotations

import numpy as np
import pytest

from gtm.errors import NoEligibleCandidate, PluginError
from gtm.metrics import new_registry
from gtm.models import Tier, decision_adapter
from gtm.routing.framework import Plugin, Removal
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.routing.runner import Weighted
from zone_agent.accounting import Accounting
from zone_agent.batch import ZoneBatch
from zone_agent.errors import ModelNotServed
from zone_agent.health import HealthStatus
from zone_agent.plugins.health_filter import HealthFilter
from zone_agent.plugins.ttft_scorer import TtftScorer
from zone_agent.router import RETRY_STEP, ZoneProfile
from zone_agent.view import Floats

from .helpers import Gpu, make_request, make_view, zone_profile


class Const(Plugin):
    def __init__(self, name: str, values: list[float]) -> None:
        super().__init__(name)
        self._values = values

    def scores(self, batch: ZoneBatch, /) -> Floats:
        return np.array(self._values, dtype=np.float64)


class Broken(Plugin):
    def __init__(self) -> None:
        super().__init__("broken")

    def removes(self, batch: ZoneBatch, /) -> Removal | None:
        raise ZeroDivisionError("oops")


def profile(*scorers: Weighted, filters: tuple[object, ...] = ()) -> ZoneProfile:
    return zone_profile(
        "test",
        [HealthFilter(), *filters],  # type: ignore[list-item]
        list(scorers),
        MaxScorePicker(),
        cost_model=TtftScorer(),
    )


def test_weighted_totals_and_a_full_trace() -> None:
    view = make_view([Gpu("a"), Gpu("b"), Gpu("c", health=HealthStatus(False, "ejected"))])
    p = profile(
        Weighted(Const("x", [0.2, 0.9, 1.0]), 1.0),
        Weighted(Const("y", [1.0, 0.0, 1.0]), 3.0),
    )
    decision = p.decide(make_request(), view)
    assert decision.gpu_id == "a"  # (0.2 + 3) / 4 beats (0.9 + 0) / 4
    assert decision.outcome.totals[0] == pytest.approx(0.8)
    record = decision.to_decision()
    assert record.tier is Tier.ZONE
    assert record.choice == "a"
    assert record.trace.candidates == ("a", "b", "c")
    assert record.trace.removed_by() == {"c": "health-filter"}
    assert record.trace.filters[0].reasons == (("c", "ejected"),)
    assert record.trace.weights == (("x", 1.0), ("y", 3.0))
    assert [s.candidate for s in record.trace.scores] == ["a", "b"]
    assert record.predicted_ttft_ms is not None
    assert record.predicted_ttft_ms > 0
    # The trace serialises with the shared adapter and reads back equal.
    assert decision_adapter.validate_json(decision_adapter.dump_json(record)) == record


def test_trace_keeps_the_top_n_and_the_choice() -> None:
    view = make_view([Gpu(f"g{i}") for i in range(6)])
    p = profile(Weighted(Const("x", [0.9, 0.1, 0.8, 0.7, 0.6, 0.5]), 1.0))
    record = p.decide(make_request(), view).to_decision(top=2)
    assert [s.candidate for s in record.trace.scores] == ["g0", "g2"]
    assert record.trace.scores_omitted == 4


def test_out_of_range_scores_are_repaired() -> None:
    view = make_view([Gpu("a"), Gpu("b")])
    p = profile(Weighted(Const("x", [float("nan"), 7.0]), 1.0))
    decision = p.decide(make_request(), view)
    assert decision.gpu_id == "b"
    assert list(decision.outcome.scores[0][1]) == [0.0, 1.0]


def test_filtering_to_zero_names_the_filter_and_keeps_the_trace() -> None:
    view = make_view([Gpu("a", drained=True)])
    metrics = RoutingMetrics(new_registry())
    p = zone_profile("t", [HealthFilter()], [], MaxScorePicker(), metrics=metrics)
    with pytest.raises(NoEligibleCandidate) as info:
        p.decide(make_request(), view)
    assert info.value.filter_name == "health-filter"
    assert "drained" in info.value.reason
    assert info.value.trace is not None
    assert info.value.trace.removed_by() == {"a": "health-filter"}


def test_retries_exclude_tried_gpus() -> None:
    view = make_view([Gpu("a"), Gpu("b")])
    p = profile()
    assert p.decide(make_request(), view, exclude=frozenset({"a"})).gpu_id == "b"
    with pytest.raises(NoEligibleCandidate) as info:
        p.decide(make_request(), view, exclude=frozenset({"a", "b"}))
    assert info.value.filter_name == RETRY_STEP


def test_unknown_model() -> None:
    with pytest.raises(ModelNotServed, match="nope"):
        profile().decide(make_request(model="nope"), make_view([Gpu("a")]))


def test_a_plugin_crash_becomes_a_plugin_error() -> None:
    with pytest.raises(PluginError, match=r"broken.*ZeroDivisionError"):
        profile(filters=(Broken(),)).decide(make_request(), make_view([Gpu("a")]))


def test_every_profile_starts_with_the_health_filter() -> None:
    with pytest.raises(PluginError, match="health-filter"):
        zone_profile("t", [], [], MaxScorePicker())


def test_metrics_are_recorded_per_plugin() -> None:
    registry = new_registry()
    metrics = RoutingMetrics(registry)
    p = zone_profile(
        "t",
        [HealthFilter()],
        [Weighted(TtftScorer(), 1)],
        MaxScorePicker(),
        cost_model=TtftScorer(),
        metrics=metrics,
        plugin_timing_every=2,
    )
    for _ in range(4):
        p.decide(make_request(), make_view([Gpu("a")]))
    labels = {"tier": "zone", "extension_point": "scorer", "plugin": "ttft-scorer"}
    # Plugins are timed on one decision in two; every decision is timed.
    assert registry.get_sample_value("gtm_routing_plugin_duration_seconds_count", labels) == 2
    cost = {"tier": "zone", "extension_point": "cost_model", "plugin": "ttft-scorer"}
    assert registry.get_sample_value("gtm_routing_plugin_duration_seconds_count", cost) == 2
    assert (
        registry.get_sample_value(
            "gtm_routing_decision_duration_seconds_count", {"tier": "zone", "profile": "t"}
        )
        == 4
    )


def test_loads_are_a_snapshot_taken_at_the_decision() -> None:
    acc = Accounting()
    view = make_view([Gpu("a")], acc)
    b = ZoneBatch(make_request(), view, view.by_model[make_request().model])
    before = b.pending.copy()
    acc.start("a", prefill_tokens=500)
    assert list(b.pending) == list(before)  # the batch holds a copy

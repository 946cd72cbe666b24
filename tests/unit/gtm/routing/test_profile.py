from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gtm.errors import ConfigError, NoEligibleCandidate, PluginError, RoutingError
from gtm.metrics import new_registry
from gtm.models import (
    RouteRequest,
    ScoreIssueKind,
    Tier,
    decision_adapter,
    decision_trace_adapter,
)
from gtm.routing import (
    NO_CANDIDATES_OFFERED,
    FilterResult,
    Profile,
    RoutingMetrics,
    Scored,
    WeightedScorer,
)
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.routing.profile import DEFAULT_PLUGIN_TIMING_EVERY
from tests.unit.gtm.routing.helpers import (
    Ctx,
    FakeTimer,
    FixedScorer,
    LoadCost,
    LoadScorer,
    Node,
    PredicateFilter,
    drop,
    nodes,
    request,
)

CTX = Ctx()


def profile(
    filters: Sequence[PredicateFilter] = (),
    scorers: Sequence[WeightedScorer[Node, Ctx]] = (),
    **kwargs: object,
) -> Profile[Node, Ctx]:
    return Profile("p", Tier.ZONE, filters, scorers, MaxScorePicker(), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- filters


def test_filters_run_in_order_and_each_sees_only_the_survivors() -> None:
    first, second = drop("a", name="first"), drop("b", name="second")
    decision = profile([first, second]).run(request(), nodes("a", "b", "c"), CTX)
    assert first.seen == [("a", "b", "c")]
    assert second.seen == [("b", "c")]
    assert decision.choice == "c"
    assert [step.plugin for step in decision.trace.filters] == ["first", "second"]


def test_trace_records_removals_scores_totals_weights_and_picker() -> None:
    scorers = [
        WeightedScorer(FixedScorer("s1", {"b": 0.5, "c": 1.0}), 1.0),
        WeightedScorer(FixedScorer("s2", {"b": 1.0, "c": 0.0}), 3.0),
    ]
    decision = profile([drop("a", reason="drained")], scorers).run(
        request("r-7"), nodes("a", "b", "c"), CTX
    )
    trace = decision.trace
    assert decision.request_id == "r-7"
    assert decision.tier is Tier.ZONE
    assert trace.profile == "p"
    assert trace.candidates == ("a", "b", "c")
    (step,) = trace.filters
    assert (step.plugin, step.removed, step.reasons, step.remaining) == (
        "drop",
        ("a",),
        (("a", "drained"),),
        2,
    )
    assert trace.removed_by() == {"a": "drop"}
    by_id = {s.candidate: s for s in trace.scores}
    assert set(by_id) == {"b", "c"}
    assert by_id["b"].scores == (("s1", 0.5), ("s2", 1.0))
    assert by_id["b"].total == pytest.approx((1 * 0.5 + 3 * 1.0) / 4)
    assert by_id["c"].total == pytest.approx((1 * 1.0 + 3 * 0.0) / 4)
    assert decision.choice == "b"
    assert trace.picker == "max-score-picker"
    assert trace.weights == (("s1", 1.0), ("s2", 3.0))
    assert trace.score_issues == ()
    assert decision.predicted_ttft_ms is None


def test_choose_returns_the_candidate_object() -> None:
    candidates = (Node("a", load=0.9), Node("b", load=0.1))
    choice = profile(scorers=[WeightedScorer(LoadScorer())]).choose(request(), candidates, CTX)
    assert choice.candidate is candidates[1]
    assert choice.decision.choice == "b"


def test_without_scorers_totals_are_zero_and_ties_go_to_the_smallest_id() -> None:
    decision = profile().run(request(), nodes("c", "a", "b"), CTX)
    assert decision.choice == "a"
    assert [s.total for s in decision.trace.scores] == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------------------- clamping


@pytest.mark.parametrize(
    ("raw", "expected", "kind"),
    [
        (0.25, 0.25, None),
        (0, 0.0, None),
        (1, 1.0, None),
        (math.nan, 0.0, ScoreIssueKind.NAN),
        (math.inf, 1.0, ScoreIssueKind.ABOVE),
        (-math.inf, 0.0, ScoreIssueKind.BELOW),
        (-0.5, 0.0, ScoreIssueKind.BELOW),
        (1.5, 1.0, ScoreIssueKind.ABOVE),
        (None, 0.0, ScoreIssueKind.MISSING),
    ],
)
def test_runner_clamps_scores_and_counts_repairs(
    raw: float | None, expected: float, kind: ScoreIssueKind | None
) -> None:
    registry = new_registry()
    values = {"b": 0.5} if raw is None else {"a": raw, "b": 0.5}
    p = profile(
        scorers=[WeightedScorer(FixedScorer("s", values))], metrics=RoutingMetrics(registry)
    )
    decision = p.run(request(), nodes("a", "b"), CTX)
    by_id = {s.candidate: s for s in decision.trace.scores}
    assert by_id["a"].score("s") == expected
    assert by_id["a"].total == expected
    assert by_id["b"].score("s") == 0.5
    issues = [(i.plugin, i.candidate, i.kind) for i in decision.trace.score_issues]
    assert issues == ([] if kind is None else [("s", "a", kind)])
    for k in ScoreIssueKind:
        count = registry.get_sample_value(
            "gtm_routing_score_issues_total", {"tier": "zone", "plugin": "s", "kind": k}
        )
        assert (count or 0.0) == (1.0 if k == kind else 0.0)


@pytest.mark.parametrize("bad", ["0.5", object(), [0.5]])
def test_non_numeric_score_is_a_plugin_error_naming_the_scorer(bad: object) -> None:
    p = profile(scorers=[WeightedScorer(FixedScorer("odd", {"a": bad}))])  # type: ignore[dict-item]
    with pytest.raises(PluginError, match=r"'odd'.*'a'.*not a number"):
        p.run(request(), nodes("a"), CTX)


def test_scorer_returning_a_non_mapping_is_a_plugin_error() -> None:
    p = profile(scorers=[WeightedScorer(FixedScorer("list", [0.5]))])  # type: ignore[arg-type]
    with pytest.raises(PluginError, match="'list' returned list"):
        p.run(request(), nodes("a"), CTX)


# ---------------------------------------------------------------------------- weights


@pytest.mark.parametrize(
    ("weights", "scores_a", "scores_b", "winner"),
    [
        ((1.0, 1.0), (1.0, 0.0), (0.0, 0.9), "a"),  # 0.5 vs 0.45
        ((1.0, 2.0), (1.0, 0.0), (0.0, 0.9), "b"),  # 0.333 vs 0.6
        ((0.1, 10.0), (1.0, 0.0), (0.0, 0.2), "b"),
    ],
)
def test_weighted_total_is_sum_of_weight_times_score_over_sum_of_weights(
    weights: tuple[float, float],
    scores_a: tuple[float, float],
    scores_b: tuple[float, float],
    winner: str,
) -> None:
    scorers = [
        WeightedScorer(FixedScorer(f"s{i}", {"a": scores_a[i], "b": scores_b[i]}), weights[i])
        for i in range(2)
    ]
    decision = profile(scorers=scorers).run(request(), nodes("a", "b"), CTX)
    totals = {s.candidate: s.total for s in decision.trace.scores}
    for cid, sc in (("a", scores_a), ("b", scores_b)):
        assert totals[cid] == pytest.approx(
            (weights[0] * sc[0] + weights[1] * sc[1]) / sum(weights)
        )
    assert decision.choice == winner


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf, 1e7])
def test_weight_must_be_positive_and_bounded(weight: float) -> None:
    with pytest.raises(PluginError, match="'load': weight"):
        profile(scorers=[WeightedScorer(LoadScorer(), weight)])


def test_plugin_names_must_be_unique_per_extension_point() -> None:
    with pytest.raises(PluginError, match="two filter plugins are named 'x'"):
        profile([drop("a", name="x"), drop("b", name="x")])
    with pytest.raises(PluginError, match="two scorer plugins are named 'load'"):
        profile(scorers=[WeightedScorer(LoadScorer()), WeightedScorer(LoadScorer())])


def test_a_profile_needs_its_picker() -> None:
    with pytest.raises(PluginError, match="exactly one picker"):
        Profile("p", Tier.ZONE, [], [], None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- refusals


def test_filtering_to_zero_names_the_filter_and_carries_the_partial_trace() -> None:
    registry = new_registry()
    filters = [drop("a", name="residency"), drop("b", name="health", reason="unhealthy")]
    p = profile(filters, [WeightedScorer(LoadScorer())], metrics=RoutingMetrics(registry))
    with pytest.raises(NoEligibleCandidate, match="'health'") as caught:
        p.run(request(), nodes("a", "b"), CTX)
    error = caught.value
    assert error.filter_name == "health"
    assert "'b': unhealthy" in error.reason
    assert error.trace is not None
    assert error.trace.candidates == ("a", "b")
    assert [s.plugin for s in error.trace.filters] == ["residency", "health"]
    assert error.trace.removed_by() == {"a": "residency", "b": "health"}
    assert error.trace.scores == ()
    labels = {"tier": "zone", "profile": "p", "filter": "health"}
    assert registry.get_sample_value("gtm_routing_no_eligible_candidate_total", labels) == 1.0


def test_no_candidates_offered_is_refused_before_any_filter() -> None:
    first = drop("a")
    with pytest.raises(NoEligibleCandidate) as caught:
        profile([first]).run(request(), (), CTX)
    assert caught.value.filter_name == NO_CANDIDATES_OFFERED
    assert caught.value.trace is not None
    assert caught.value.trace.filters == ()
    assert first.seen == []


def test_duplicate_candidate_ids_are_refused() -> None:
    with pytest.raises(RoutingError, match="not unique"):
        profile().run(request(), nodes("a", "a"), CTX)


# ---------------------------------------------------------------------------- plugin bugs


class _Broken:
    name = "broken"

    def filter(self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /) -> object:
        raise ZeroDivisionError("boom")

    def score(self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /) -> object:
        raise KeyError("boom")

    def pick(self, request: RouteRequest, scored: Sequence[Scored[Node]], /) -> Node:
        raise IndexError("boom")

    def cost_ms(self, request: RouteRequest, candidate: Node, ctx: Ctx, /) -> float:
        raise ValueError("boom")


@pytest.mark.parametrize("point", ["filter", "scorer", "picker", "cost_model"])
def test_a_plugin_that_raises_becomes_a_plugin_error_naming_it(point: str) -> None:
    broken: Any = _Broken()  # deliberately breaks every contract
    p: Profile[Node, Ctx] = Profile(
        "p",
        Tier.GLOBAL,
        [broken] if point == "filter" else [],
        [WeightedScorer(broken)] if point == "scorer" else [],
        broken if point == "picker" else MaxScorePicker(),
        cost_model=broken if point == "cost_model" else None,
    )
    with pytest.raises(PluginError, match=f"{point} plugin 'broken' failed: .*boom"):
        p.run(request(), nodes("a"), CTX)


class _Miscounting:
    name = "miscount"

    def filter(
        self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /
    ) -> FilterResult[Node]:
        return FilterResult(tuple(candidates[1:]))  # drops one without saying why


def test_a_filter_must_account_for_every_candidate() -> None:
    p = profile([_Miscounting()])  # type: ignore[list-item]
    with pytest.raises(PluginError, match="'miscount' kept 1 and removed 0 of 2"):
        p.run(request(), nodes("a", "b"), CTX)


class _Stranger:
    name = "stranger"

    def pick(self, request: RouteRequest, scored: Sequence[Scored[Node]], /) -> Node:
        return Node("zz")


def test_a_picker_must_choose_a_survivor() -> None:
    p: Profile[Node, Ctx] = Profile("p", Tier.ZONE, [drop("a")], [], _Stranger())
    with pytest.raises(PluginError, match=r"'stranger' returned .* not one of the candidates"):
        p.run(request(), nodes("a", "b"), CTX)


# ---------------------------------------------------------------------------- cost


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [(Node("a", load=0.5), 50.0), (Node("a", load=0.0), 0.0), (Node("a", healthy=False), None)],
)
def test_cost_model_prices_the_choice(candidate: Node, expected: float | None) -> None:
    p = profile(cost_model=LoadCost())
    assert p.run(request(), (candidate,), CTX).predicted_ttft_ms == expected
    assert p.cost_model_name == "load-cost"


# ---------------------------------------------------------------------------- metrics


def test_plugin_latency_histogram_records_one_sample_per_plugin_call() -> None:
    registry = new_registry()
    timer = FakeTimer()
    p = profile(
        [drop("a", name="f1"), drop("zz", name="f2")],
        [WeightedScorer(LoadScorer())],
        cost_model=LoadCost(),
        metrics=RoutingMetrics(registry),
        timer=timer,
        plugin_timing_every=1,
    )
    for _ in range(3):
        p.run(request(), nodes("a", "b"), CTX)
    name = "gtm_routing_plugin_duration_seconds"
    for point, plugin in [
        ("filter", "f1"),
        ("filter", "f2"),
        ("scorer", "load"),
        ("picker", "max-score-picker"),
        ("cost_model", "load-cost"),
    ]:
        labels = {"tier": "zone", "extension_point": point, "plugin": plugin}
        assert registry.get_sample_value(f"{name}_count", labels) == 3.0
        # The fake timer advances one step per read: each call measures exactly one step.
        assert registry.get_sample_value(f"{name}_sum", labels) == 3 * timer.step
        assert registry.get_sample_value(f"{name}_bucket", {**labels, "le": "1e-06"}) == 3.0
    decision_labels = {"tier": "zone", "profile": "p"}
    count = registry.get_sample_value(
        "gtm_routing_decision_duration_seconds_count", decision_labels
    )
    assert count == 3.0


def test_plugin_latency_is_sampled_on_the_first_decision_and_then_one_in_n() -> None:
    registry = new_registry()
    timer = FakeTimer()
    p = profile(
        [drop("zz", name="f")],
        [WeightedScorer(LoadScorer())],
        metrics=RoutingMetrics(registry),
        timer=timer,
        plugin_timing_every=4,
    )
    assert p.plugin_timing_every == 4
    for _ in range(9):  # decisions 0, 4 and 8 are timed
        p.run(request(), nodes("a", "b"), CTX)
    name = "gtm_routing_plugin_duration_seconds"
    for point, plugin in [("filter", "f"), ("scorer", "load"), ("picker", "max-score-picker")]:
        labels = {"tier": "zone", "extension_point": point, "plugin": plugin}
        assert registry.get_sample_value(f"{name}_count", labels) == 3.0
        assert registry.get_sample_value(f"{name}_sum", labels) == 3 * timer.step
    # The whole-decision duration is observed on every decision.
    decision_labels = {"tier": "zone", "profile": "p"}
    count = registry.get_sample_value(
        "gtm_routing_decision_duration_seconds_count", decision_labels
    )
    assert count == 9.0


def test_default_plugin_timing_samples_one_decision_in_sixteen() -> None:
    registry = new_registry()
    p = profile(metrics=RoutingMetrics(registry))
    assert p.plugin_timing_every == DEFAULT_PLUGIN_TIMING_EVERY == 16
    for _ in range(17):
        p.run(request(), nodes("a"), CTX)
    labels = {"tier": "zone", "extension_point": "picker", "plugin": "max-score-picker"}
    assert registry.get_sample_value("gtm_routing_plugin_duration_seconds_count", labels) == 2.0


@pytest.mark.parametrize("every", [0, -1])
def test_plugin_timing_every_must_be_positive(every: int) -> None:
    with pytest.raises(ConfigError, match="plugin_timing_every"):
        profile(plugin_timing_every=every)


def test_without_metrics_the_timer_is_never_read() -> None:
    timer = FakeTimer()
    profile([drop("a")], [WeightedScorer(LoadScorer())], timer=timer).run(
        request(), nodes("a", "b"), CTX
    )
    assert timer.now == 0.0


def test_without_metrics_nothing_is_registered() -> None:
    registry = CollectorRegistry()
    profile([drop("a")], [WeightedScorer(LoadScorer())]).run(request(), nodes("a", "b"), CTX)
    assert list(registry.collect()) == []


def test_profiles_share_one_routing_metrics_per_registry() -> None:
    registry = new_registry()
    metrics = RoutingMetrics(registry)
    old, new = profile(metrics=metrics), profile(metrics=metrics)  # e.g. a hot reload
    old.run(request(), nodes("a"), CTX)
    new.run(request(), nodes("a"), CTX)
    labels = {"tier": "zone", "extension_point": "picker", "plugin": "max-score-picker"}
    assert registry.get_sample_value("gtm_routing_plugin_duration_seconds_count", labels) == 2.0
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        RoutingMetrics(registry)


# ---------------------------------------------------------------------------- properties

_score_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=1.0),
    st.none(),
)


# derandomize: the same examples on every run, as the rest of the suite is deterministic.
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(min_value=1, max_value=12),
    removed=st.sets(st.integers(min_value=0, max_value=11)),
    weights=st.lists(
        st.floats(min_value=1e-6, max_value=1e6, allow_nan=False), min_size=0, max_size=4
    ),
    raw=st.lists(st.lists(_score_values, min_size=12, max_size=12), min_size=4, max_size=4),
)
def test_totals_stay_in_unit_interval_and_the_choice_survived_the_filters(
    n: int, removed: set[int], weights: list[float], raw: list[list[float | None]]
) -> None:
    ids = [f"n{i}" for i in range(n)]
    scorers = [
        WeightedScorer(
            FixedScorer(
                f"s{j}", {cid: v for cid, v in zip(ids, raw[j], strict=False) if v is not None}
            ),
            w,
        )
        for j, w in enumerate(weights)
    ]
    dropped = {ids[i] for i in removed if i < n}
    p = profile([drop(*dropped)], scorers)
    if dropped == set(ids):
        with pytest.raises(NoEligibleCandidate, match="'drop'"):
            p.run(request(), nodes(*ids), CTX)
        return
    decision = p.run(request(), nodes(*ids), CTX)
    survivors = set(ids) - dropped
    assert decision.choice in survivors
    assert {s.candidate for s in decision.trace.scores} == survivors
    for entry in decision.trace.scores:
        assert 0.0 <= entry.total <= 1.0
        assert all(0.0 <= value <= 1.0 for _, value in entry.scores)


def test_scorer_mapping_may_hold_extra_ids() -> None:
    values: Mapping[str, float] = {"a": 0.2, "b": 0.9, "gone": 1.0}
    p = profile([drop("b")], [WeightedScorer(FixedScorer("s", values))])
    decision = p.run(request(), nodes("a", "b"), CTX)
    assert decision.choice == "a"
    assert decision.trace.score_issues == ()


# ---------------------------------------------------------------------------- trace size


@pytest.mark.parametrize(
    ("limit", "traced", "omitted"),
    [
        (None, ["a", "b", "c", "d", "e"], 0),
        (10, ["a", "b", "c", "d", "e"], 0),
        (2, ["b", "d"], 3),  # the two best, in candidate order
        (0, ["d"], 4),  # the choice is always traced
    ],
)
def test_trace_scores_keeps_the_best_and_the_choice(
    limit: int | None, traced: list[str], omitted: int
) -> None:
    candidates = tuple(
        Node(cid, load=load) for cid, load in zip("abcde", (0.5, 0.2, 0.9, 0.1, 0.7), strict=True)
    )
    p = profile(scorers=[WeightedScorer(LoadScorer())], trace_scores=limit)
    decision = p.run(request(), candidates, CTX)
    assert decision.choice == "d"
    assert [s.candidate for s in decision.trace.scores] == traced
    assert decision.trace.scores_omitted == omitted
    assert decision.trace.candidates == ("a", "b", "c", "d", "e")


def test_trace_scores_keeps_the_choice_even_when_a_random_picker_takes_a_weak_one() -> None:
    class Worst:
        name = "worst"

        def pick(self, request: RouteRequest, scored: Sequence[Scored[Node]], /) -> Node:
            return min(scored, key=lambda s: s.total).candidate

    candidates = (Node("a", load=0.1), Node("b", load=0.2), Node("c", load=0.9))
    p: Profile[Node, Ctx] = Profile(
        "p", Tier.ZONE, [], [WeightedScorer(LoadScorer())], Worst(), trace_scores=1
    )
    decision = p.run(request(), candidates, CTX)
    assert decision.choice == "c"
    assert [s.candidate for s in decision.trace.scores] == ["a", "c"]
    assert decision.trace.scores_omitted == 1


def test_negative_trace_scores_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="trace_scores"):
        profile(trace_scores=-1)


class _OddReason:
    name = "odd-reason"

    def filter(
        self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /
    ) -> FilterResult[Node]:
        return FilterResult(tuple(candidates[1:]), ((candidates[0].id, 42),))  # type: ignore[arg-type]


def test_trace_data_that_does_not_validate_is_a_plugin_error() -> None:
    p = profile([_OddReason()])  # type: ignore[list-item]
    with pytest.raises(PluginError, match="does not fit the decision trace"):
        p.run(request(), nodes("a", "b"), CTX)


class _Removes:
    """A filter that removes the first candidate and reports it as given."""

    name = "removes"

    def __init__(self, removed: object) -> None:
        self.removed = removed

    def filter(
        self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /
    ) -> FilterResult[Node]:
        return FilterResult(tuple(candidates[1:]), self.removed)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "removed",
    [
        ((5, "why"),),  # not a string id
        (("a", None),),  # not a string reason
        (("a", "why", "extra"),),  # not a pair
        ("ab",),  # a string is not a pair
        ((("a", "why"),),),  # nested too deep
        (None,),
    ],
)
def test_removals_that_are_not_string_pairs_are_a_plugin_error(removed: object) -> None:
    p = profile([_Removes(removed)])  # type: ignore[list-item]
    with pytest.raises(PluginError, match="'removes' returned data that does not fit"):
        p.run(request(), nodes("a", "b"), CTX)


class _Why(StrEnum):
    DRAINED = "drained"


def test_removals_given_as_lists_or_str_subclasses_are_traced_as_tuples() -> None:
    p = profile([_Removes([["a", _Why.DRAINED]])])  # type: ignore[list-item]
    (step,) = p.run(request(), nodes("a", "b"), CTX).trace.filters
    assert step.removed == ("a",)
    assert step.reasons == (("a", "drained"),)
    assert type(step.reasons) is tuple
    assert type(step.reasons[0]) is tuple


class _NotAResult:
    name = "not-a-result"

    def filter(self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /) -> object:
        return list(candidates)


def test_a_filter_must_return_a_filter_result() -> None:
    p = profile([_NotAResult()])  # type: ignore[list-item]
    with pytest.raises(PluginError, match="'not-a-result' returned list, not a FilterResult"):
        p.run(request(), nodes("a"), CTX)


def test_scores_may_come_in_any_order() -> None:
    values = {"c": 0.1, "b": 0.9, "a": 0.5}  # not the candidates' order
    scorers = [WeightedScorer(FixedScorer(f"s{i}", values)) for i in range(3)]
    decision = profile(scorers=scorers).run(request(), nodes("a", "b", "c"), CTX)
    assert decision.choice == "b"
    assert [(s.candidate, s.score("s1"), s.total) for s in decision.trace.scores] == [
        ("a", 0.5, 0.5),
        ("b", 0.9, pytest.approx(0.9)),
        ("c", 0.1, pytest.approx(0.1)),
    ]


def test_decisions_and_refusals_serialise_through_the_adapters() -> None:
    scorers = [WeightedScorer(LoadScorer()), WeightedScorer(FixedScorer("nan", {"b": math.nan}))]
    p = profile([drop("a", reason="drained")], scorers, cost_model=LoadCost())
    decision = p.run(request(), (Node("a"), Node("b", load=0.5), Node("c", load=0.2)), CTX)
    assert decision.trace.score_issues  # a repaired score is in the trace too
    assert decision_adapter.validate_json(decision_adapter.dump_json(decision)) == decision
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.trace.filters[0].remaining = 0  # type: ignore[misc]
    with pytest.raises(NoEligibleCandidate) as caught:
        p.run(request(), nodes("a"), CTX)
    trace = caught.value.trace
    assert trace is not None
    assert decision_trace_adapter.validate_json(decision_trace_adapter.dump_json(trace)) == trace

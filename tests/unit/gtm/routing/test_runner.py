"""The one runner (gtm.routing.runner): filters → weighted scorers → one picker, over
columns, with prepare hooks, capability-declared fast paths and a lazy trace."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm.errors import NoEligibleCandidate, PluginError
from gtm.metrics import new_registry
from gtm.models import RouteRequest, ScoreIssueKind, Tier, decision_adapter, decision_trace_adapter
from gtm.routing import (
    NO_CANDIDATES_OFFERED,
    Capability,
    FastPath,
    Match,
    Plugin,
    Removal,
    RoutingMetrics,
    Runner,
    Stage,
    Step,
    Weighted,
)
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.routing.pickers.random_pick import RandomPicker
from tests.unit.gtm.routing.helpers import (
    FakeTimer,
    FixedScorer,
    LoadCost,
    LoadScorer,
    Node,
    NodeBatch,
    batch,
    drop,
    request,
)


def runner(
    filters: Sequence[Any] = (), scorers: Sequence[Weighted] = (), **kwargs: Any
) -> Runner[NodeBatch]:
    picker = kwargs.pop("picker", MaxScorePicker())
    return Runner("p", Tier.ZONE, filters, scorers, picker, **kwargs)


def loads(**values: float) -> tuple[Node, ...]:
    return tuple(Node(cid, load=load) for cid, load in values.items())


# ---------------------------------------------------------------------------- filters


def test_filters_run_in_order_and_each_sees_only_the_survivors() -> None:
    first, second = drop("a", name="f1"), drop("b", name="f2")
    outcome = runner([first, second]).decide(batch("a", "b", "c"))
    assert first.seen == [("a", "b", "c")]
    assert second.seen == [("b", "c")]
    assert outcome.choice_id == "c"


def test_the_trace_records_removals_scores_totals_weights_and_picker() -> None:
    r = runner(
        [drop("a", reason="gone")],
        [Weighted(LoadScorer(), 2.0), Weighted(FixedScorer("fixed", {"b": 0.5, "c": 1.0}))],
    )
    decision = r.decide(batch(*loads(a=0.0, b=0.5, c=0.75))).to_decision()
    trace = decision.trace
    assert decision.choice == "b"  # (2·0.5 + 0.5)/3 = 0.5 beats (2·0.25 + 1)/3 = 0.5 - ulp
    assert trace.candidates == ("a", "b", "c")
    assert trace.removed_by() == {"a": "drop"}
    assert trace.filters[0].reasons == (("a", "gone"),)
    assert trace.filters[0].remaining == 2
    assert [s.candidate for s in trace.scores] == ["b", "c"]
    assert trace.scores[0].scores == (("load", 0.5), ("fixed", 0.5))
    assert trace.weights == (("load", 2.0), ("fixed", 1.0))
    assert trace.picker == "max-score-picker"
    assert decision.predicted_ttft_ms is None
    assert decision.tier is Tier.ZONE


@pytest.mark.parametrize(
    ("weights", "columns"),
    [
        ((1.0,), [[0.3, 0.7]]),
        ((0.7,), [[0.3, 0.7]]),
        ((1.0, 0.3), [[0.1, 0.9], [0.4, 0.2]]),
        ((2.0, 1.0, 0.5), [[0.1, 0.9], [0.4, 0.2], [1.0, 0.0]]),
    ],
)
def test_totals_are_the_weighted_sum_over_the_weights_summed_left_to_right(
    weights: tuple[float, ...], columns: list[list[float]]
) -> None:
    scorers = [
        Weighted(FixedScorer(f"s{k}", dict(zip("ab", column, strict=True))), w)
        for k, (w, column) in enumerate(zip(weights, columns, strict=True))
    ]
    outcome = runner(scorers=scorers).decide(batch("a", "b"))
    for position in range(2):
        total = 0.0
        for weight, column in zip(weights, columns, strict=True):
            total += weight * column[position]
        assert outcome.totals[position] == total / sum(weights)  # to the bit


def test_without_scorers_totals_are_zero_and_ties_go_to_the_smallest_id() -> None:
    outcome = runner().decide(batch("c", "b", "d"))
    assert outcome.choice_id == "b"
    assert outcome.totals.tolist() == [0.0, 0.0, 0.0]


def test_emptying_the_set_names_the_filter_and_carries_the_partial_trace() -> None:
    r = runner([drop("a", name="first"), drop("b", name="second", reason="full")])
    with pytest.raises(NoEligibleCandidate) as refused:
        r.decide(batch("a", "b"))
    assert refused.value.filter_name == "second"
    assert "removed all 1, e.g. 'b': full" in str(refused.value)
    trace = refused.value.trace
    assert trace is not None
    assert [s.plugin for s in trace.filters] == ["first", "second"]
    assert trace.removed_by() == {"a": "first", "b": "second"}
    decision_trace_adapter.validate_json(decision_trace_adapter.dump_json(trace))


def test_no_candidates_offered_is_refused_before_any_filter() -> None:
    f = drop("a")
    with pytest.raises(NoEligibleCandidate) as refused:
        runner([f]).decide(batch())
    assert refused.value.filter_name == NO_CANDIDATES_OFFERED
    assert f.seen == []


def test_a_pre_step_removes_before_the_filters_and_is_traced() -> None:
    tried = np.array([True, False])
    pre = Step("retry-exclude", tried, lambda _: "already tried")
    outcome = runner([drop("zz")]).decide(batch("a", "b"), pre)
    assert outcome.choice_id == "b"
    assert outcome.to_decision().trace.removed_by() == {"a": "retry-exclude"}
    with pytest.raises(NoEligibleCandidate, match="retry-exclude"):
        runner().decide(batch("a"), Step("retry-exclude", np.array([True]), str))


# ---------------------------------------------------------------------------- scores


def test_the_runner_clamps_scores_and_records_the_repairs() -> None:
    registry = new_registry()
    values = {"a": math.nan, "b": -0.5, "c": 3.0, "d": 0.5}
    r = runner(
        [drop("e")],
        [Weighted(FixedScorer("broken", {**values, "e": math.nan}))],
        metrics=RoutingMetrics(registry),
    )
    decision = r.decide(batch("a", "b", "c", "d", "e")).to_decision()
    assert decision.choice == "c"
    assert [s.total for s in decision.trace.scores] == [0.0, 0.0, 1.0, 0.5]
    issues = {(i.candidate, i.kind) for i in decision.trace.score_issues}
    # e was removed: its NaN is nobody's issue.
    assert issues == {
        ("a", ScoreIssueKind.NAN),
        ("b", ScoreIssueKind.BELOW),
        ("c", ScoreIssueKind.ABOVE),
    }
    labels = {"tier": "zone", "plugin": "broken", "kind": "nan"}
    assert registry.get_sample_value("gtm_routing_score_issues_total", labels) == 1.0


def test_removed_positions_out_of_range_are_clamped_silently_before_weighing() -> None:
    # A scorer may leave removed positions out of range; weighed as they are, a huge
    # value overflows (numpy's RuntimeWarning, an error under the test suite's filters)
    # and inf - inf between two columns is NaN. The survivors are in range: no issue.
    registry = new_registry()
    scorers = [
        Weighted(FixedScorer("huge", {"a": 0.0, "b": 0.5, "x": 1e303}), 898513.0),
        Weighted(FixedScorer("negative", {"a": 1.0, "b": 0.0, "x": -math.inf}), 1.0),
    ]
    r = runner([drop("x")], scorers, metrics=RoutingMetrics(registry))
    outcome = r.decide(batch("a", "b", "x"))
    assert outcome.choice_id == "b"
    assert outcome.to_decision().trace.score_issues == ()
    assert np.isfinite(outcome.totals).all()
    assert [column.tolist() for _, column in outcome.scores] == [[0.0, 0.5, 1.0], [1.0, 0.0, 0.0]]
    labels = {"tier": "zone", "plugin": "huge", "kind": "above"}
    assert registry.get_sample_value("gtm_routing_score_issues_total", labels) is None


def test_a_column_of_the_wrong_length_or_type_is_a_plugin_error() -> None:
    class Short(Plugin):
        def scores(self, batch: NodeBatch, /) -> list[float]:
            return [0.5]

    class Words(Plugin):
        def scores(self, batch: NodeBatch, /) -> list[str]:
            return ["high", "low"]

    with pytest.raises(
        PluginError, match=r"scorer plugin 'short' failed: ValueError: 1 scores for 2"
    ):
        runner(scorers=[Weighted(Short("short"))]).decide(batch("a", "b"))
    with pytest.raises(PluginError, match=r"scorer plugin 'words' failed: ValueError"):
        runner(scorers=[Weighted(Words("words"))]).decide(batch("a", "b"))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- contracts


class _Raises(Plugin):
    def removes(self, batch: NodeBatch, /) -> Removal | None:
        raise RuntimeError("boom")

    def scores(self, batch: NodeBatch, /) -> list[float]:
        raise RuntimeError("boom")

    def pick(self, batch: NodeBatch, totals: Any, /) -> int:
        raise RuntimeError("boom")

    def costs_ms(self, batch: NodeBatch, /) -> list[float]:
        raise RuntimeError("boom")


@pytest.mark.parametrize("point", ["filter", "scorer", "picker", "cost_model"])
def test_a_plugin_that_raises_becomes_a_plugin_error_naming_it(point: str) -> None:
    bad = _Raises("bad")
    kwargs: dict[str, Any] = {  # type: ignore[assignment]
        "filter": {"filters": [bad]},
        "scorer": {"scorers": [Weighted(bad)]},
        "picker": {"picker": bad},
        "cost_model": {"cost_model": bad},
    }[point]
    with pytest.raises(PluginError, match=rf"{point} plugin 'bad' failed: RuntimeError: boom"):
        runner(**kwargs).decide(batch("a"))


def test_a_picker_must_choose_a_survivor() -> None:
    class Stubborn(Plugin):
        def pick(self, batch: NodeBatch, totals: Any, /) -> int:
            return 0

    with pytest.raises(PluginError, match="chose position 0, not a survivor"):
        runner([drop("a")], picker=Stubborn("stubborn")).decide(batch("a", "b"))


@pytest.mark.parametrize(
    ("node", "expected"),
    [(Node("a", load=0.25), 25.0), (Node("a", healthy=False), None)],
)
def test_the_cost_model_prices_the_choice(node: Node, expected: float | None) -> None:
    outcome = runner(cost_model=LoadCost()).decide(batch(node))
    assert outcome.predicted_ttft_ms == expected
    assert outcome.to_decision().predicted_ttft_ms == expected


class CostlyPicker(Plugin):
    """Picks the survivor the cost model prices lowest (it reads the cost model)."""

    capabilities = frozenset({Capability.READS_COST_MODEL})
    model: Any = None

    def bind_cost_model(self, model: Any, /) -> None:
        self.model = model

    def pick(self, batch: NodeBatch, totals: Any, /) -> int:
        costs = np.asarray(self.model.costs_ms(batch))
        return int(batch.survivors[costs[batch.survivors].argmin()])


def test_a_plugin_reading_the_cost_model_is_given_it_when_the_profile_is_built() -> None:
    picker, cost = CostlyPicker("costly"), LoadCost()
    r = runner(picker=picker, cost_model=cost)
    assert picker.model is cost
    assert r.decide(batch(*loads(a=0.5, b=0.1, c=0.9))).choice_id == "b"


def test_a_plugin_reading_the_cost_model_needs_one() -> None:
    with pytest.raises(PluginError, match="'costly' reads the profile's cost model"):
        runner(picker=CostlyPicker("costly"))


# ---------------------------------------------------------------------------- trace


def test_trace_scores_keeps_the_best_and_the_choice() -> None:
    r = runner(scorers=[Weighted(LoadScorer())], picker=RandomPicker(), trace_scores=1)
    nodes = loads(a=0.5, b=0.1, c=0.9, d=0.7)
    outcomes = [r.decide(batch(*nodes, req=_request(f"r{i}"))) for i in range(20)]
    for outcome in outcomes:
        trace = outcome.to_decision().trace
        kept = {s.candidate for s in trace.scores}
        assert kept == {"b", outcome.choice_id}
        assert trace.scores_omitted == 4 - len(kept)
    assert len(outcomes[0].to_decision(None).trace.scores) == 4


def test_decisions_serialise_through_the_adapter() -> None:
    decision = runner(scorers=[Weighted(LoadScorer())]).decide(batch("a", "b")).to_decision()
    assert decision_adapter.validate_json(decision_adapter.dump_json(decision)) == decision


# ---------------------------------------------------------------------------- metrics


def test_plugin_latency_is_sampled_on_the_first_decision_and_then_one_in_n() -> None:
    registry = new_registry()
    timer = FakeTimer()
    r = runner(
        [drop("zz", name="f")],
        [Weighted(LoadScorer())],
        cost_model=LoadCost(),
        metrics=RoutingMetrics(registry),
        timer=timer,
        plugin_timing_every=4,
    )
    for _ in range(9):  # decisions 0, 4 and 8 are timed
        r.decide(batch("a", "b"))
    name = "gtm_routing_plugin_duration_seconds"
    for point, plugin in [
        ("filter", "f"),
        ("scorer", "load"),
        ("picker", "max-score-picker"),
        ("cost_model", "load-cost"),
    ]:
        labels = {"tier": "zone", "extension_point": point, "plugin": plugin}
        assert registry.get_sample_value(f"{name}_count", labels) == 3.0
        # The fake timer advances one step per read: each call measures exactly one step.
        assert registry.get_sample_value(f"{name}_sum", labels) == 3 * timer.step
    decision_labels = {"tier": "zone", "profile": "p"}
    count = registry.get_sample_value(
        "gtm_routing_decision_duration_seconds_count", decision_labels
    )
    assert count == 9.0


# ---------------------------------------------------------------------------- prepare


class _Prepared(Plugin):
    """Removes the nodes its per-view work marks (counts its prepare calls)."""

    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({Capability.PREPARE})

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.views: list[object] = []

    def prepare(self, view: Any, /) -> object:
        self.views.append(view)
        return frozenset(view)

    def removes(self, batch: NodeBatch, /) -> Removal | None:
        marked: frozenset[str] = batch.prepared[self]
        mask = np.array([i in marked for i in batch.ids])
        return Removal(mask, lambda _: "marked in the view") if mask.any() else None


def test_prepare_runs_once_per_view_and_its_result_is_handed_back() -> None:
    plugin = _Prepared("marked")
    r = runner([plugin])
    first, second = ("a",), ("b",)
    picks = [
        r.decide(NodeBatch((Node("a"), Node("b")), _request(), view=view)).choice_id
        for view in (first, first, second, first, second)
    ]
    assert picks == ["b", "b", "a", "b", "a"]
    assert plugin.views == [first, second]


# ---------------------------------------------------------------------------- fast paths


class _Cap(StrEnum):
    LOAD = "load-score"


class _CapableLoad(LoadScorer):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({_Cap.LOAD})


class _LeastLoaded:
    """A CHOICE path: the least loaded survivor (what max-score over load scores picks)."""

    def __init__(self, match: Match) -> None:
        self.calls = 0

    def choose(self, batch: NodeBatch, /) -> int:
        self.calls += 1
        survivors: list[int] = batch.survivors.tolist()
        return min(survivors, key=lambda k: (batch.nodes[k].load, batch.ids[k]))


def _least_loaded_path() -> FastPath:
    return FastPath(
        "least-loaded", Stage.CHOICE, (_Cap.LOAD,), _LeastLoaded, picker=Capability.PICKS_MAX_TOTAL
    )


def test_a_fast_path_is_composed_when_the_plugins_declare_what_it_needs() -> None:
    registry = new_registry()
    r = runner(
        [drop("a")],
        [Weighted(_CapableLoad())],
        fast_paths=[_least_loaded_path()],
        metrics=RoutingMetrics(registry),
        plugin_timing_every=1000,
    )
    assert r.fast_paths == ("least-loaded",)
    labels = {"tier": "zone", "profile": "p", "path": "least-loaded"}
    assert registry.get_sample_value("gtm_routing_fast_path", labels) == 1.0
    nodes = loads(a=0.0, b=0.5, c=0.25)
    r.decide(batch(*nodes))  # the first decision is timed: plugins one by one
    outcome = r.decide(batch(*nodes))
    assert outcome.choice_id == "c"
    assert outcome.scored is None  # the path chose; scores are worked out for a trace
    reference = r.reference().decide(batch(*nodes))
    assert outcome.to_decision() == reference.to_decision()


def test_a_profile_without_its_fast_path_says_which_plugin_lacks_what(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = new_registry()
    with caplog.at_level(logging.INFO, logger="gtm.routing.runner"):
        third = runner(
            scorers=[Weighted(_CapableLoad()), Weighted(FixedScorer("extra", {}))],
            fast_paths=[_least_loaded_path()],
            metrics=RoutingMetrics(registry),
        )
    assert third.fast_paths == ()
    labels = {"tier": "zone", "profile": "p", "path": "least-loaded"}
    assert registry.get_sample_value("gtm_routing_fast_path", labels) == 0.0
    assert caplog.text.count("without a fast path") == 1
    assert "least-loaded: scorer 'extra' (FixedScorer) is one more than it takes (1)" in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gtm.routing.runner"):
        runner(scorers=[Weighted(LoadScorer())], fast_paths=[_least_loaded_path()])
    assert "scorer 'load' (LoadScorer) lacks 'load-score'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gtm.routing.runner"):
        runner(
            scorers=[Weighted(_CapableLoad())],
            picker=RandomPicker(),
            fast_paths=[_least_loaded_path()],
        )
    assert "picker 'random-picker' (RandomPicker) lacks 'picks-max-total'" in caplog.text


def test_a_filter_path_replaces_the_chain_and_may_defer() -> None:
    class Cap(StrEnum):
        DROPS = "drops"

    class Droppy(Plugin):
        capabilities: ClassVar[frozenset[StrEnum]] = frozenset({Cap.DROPS})

        def removes(self, batch: NodeBatch, /) -> Removal | None:
            return Removal(np.array([i == "a" for i in batch.ids]), lambda _: "dropped")

    taken: list[tuple[str, ...]] = []

    class Fused:
        def __init__(self, match: Match) -> None:
            self.plugin = match.filters[0]

        def filter(self, batch: NodeBatch, /) -> tuple[Step, ...] | None:
            if "x" in batch.ids:
                return None  # anything unusual: the filters one by one
            taken.append(tuple(batch.ids))
            removal = self.plugin.removes(batch)
            assert removal is not None
            batch.alive &= ~removal.mask
            batch.all_alive = False
            batch.seal()
            return (Step(self.plugin.name, removal.mask, removal.reason),)

    path = FastPath("fused", Stage.FILTERS, (Cap.DROPS,), Fused)
    r = runner([Droppy("droppy")], fast_paths=[path], plugin_timing_every=1000)
    for ids in (("a", "b"), ("a", "c"), ("a", "x")):
        outcome = r.decide(batch(*ids))
        assert outcome.to_decision().trace.removed_by() == {"a": "droppy"}
    # "x" makes the path defer: the filters run one by one.
    assert taken == [("a", "b"), ("a", "c")]


# ---------------------------------------------------------------------------- property


def _request(request_id: str = "req-1") -> RouteRequest:
    return request(request_id)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(min_value=1, max_value=12),
    removed=st.sets(st.integers(min_value=0, max_value=11)),
    weights=st.lists(st.floats(min_value=1e-6, max_value=1e6), min_size=0, max_size=4),
    raw=st.lists(
        st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=12, max_size=12),
        min_size=4,
        max_size=4,
    ),
)
def test_totals_stay_in_the_unit_interval_and_the_choice_survived_the_filters(
    n: int, removed: set[int], weights: list[float], raw: list[list[float]]
) -> None:
    ids = [f"n{k:02d}" for k in range(n)]
    dropped = {ids[k] for k in removed if k < n}
    scorers = [
        Weighted(FixedScorer(f"s{k}", dict(zip(ids, raw[k], strict=False))), w)
        for k, w in enumerate(weights)
    ]
    r = runner([drop(*dropped)], scorers)
    if len(dropped) == n:
        with pytest.raises(NoEligibleCandidate):
            r.decide(batch(*ids))
        return
    outcome = r.decide(batch(*ids))
    assert outcome.choice_id not in dropped
    live = outcome.totals[outcome.batch.survivors]
    assert ((live >= 0.0) & (live <= 1.0)).all()
    assert outcome.totals[outcome.choice] == live.max()

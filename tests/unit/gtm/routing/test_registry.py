from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import BaseModel

from gtm.errors import PluginError
from gtm.metrics import new_registry
from gtm.models import Frozen, Tier
from gtm.routing import (
    VOCABULARY_ALIASES,
    PluginRegistry,
    ProfileSpec,
    RoutingMetrics,
    default_registry,
    load_profile_spec,
)
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.routing.pickers.random_pick import RandomPicker
from gtm.routing.runner import DEFAULT_PLUGIN_TIMING_EVERY, FastPath, Stage
from tests.unit.gtm.routing.helpers import LoadCost, LoadScorer, Node, batch


class _NoParams(Frozen):
    pass


class _LoadParams(Frozen):
    scale: float = 1.0


class _LoadScorerAndCost(LoadScorer, LoadCost):
    """One plugin that is both a scorer and a cost model."""

    def __init__(self, name: str) -> None:
        self.name = name


def _registry() -> PluginRegistry:
    registry = default_registry()
    registry.register("load-scorer", _LoadParams, lambda name, _p: LoadScorer(name))
    registry.register("load-ttft", _NoParams, lambda name, _p: _LoadScorerAndCost(name))
    return registry


def _spec(**profile: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"picker": "max-score-picker"}
    body.update(profile)
    return {
        "name": "zone-default",
        "plugins": [
            {"type": "allow-list-filter", "name": "allowed", "parameters": {"from_context": True}},
            {"type": "load-scorer", "name": "load", "parameters": {"scale": 2}},
            {"type": "load-ttft", "name": "ttft"},
            {"type": "max-score-picker"},
            {"type": "random", "name": "coin"},
        ],
        "profile": body,
    }


def _build(data: Mapping[str, Any], **kwargs: Any) -> Any:
    return _registry().build(load_profile_spec(data), tier=Tier.ZONE, **kwargs)


def test_builds_and_runs_a_profile_from_configuration() -> None:
    data = _spec(
        filters=["allowed"],
        scorers=[{"ref": "load", "weight": 2}, {"ref": "ttft"}],
        cost_model="ttft",
    )
    profile = _build(data, metrics=RoutingMetrics(new_registry()))
    assert profile.name == "zone-default"
    assert [f.name for f in profile.filters] == ["allowed"]
    assert profile.weights == (("load", 2.0), ("ttft", 1.0))
    assert profile.picker.name == "max-score-picker"
    assert profile.cost_model.name == "ttft"
    candidates = (Node("a", load=0.2), Node("b", load=0.1), Node("c", load=0.0))
    decision = profile.decide(batch(*candidates, allowed={"a", "b"})).to_decision()
    assert decision.choice == "b"
    assert decision.trace.removed_by() == {"c": "allowed"}
    assert decision.predicted_ttft_ms == pytest.approx(10.0)


def test_a_plugin_referenced_twice_is_built_once() -> None:
    built: list[str] = []

    def factory(name: str, params: _NoParams) -> object:
        built.append(name)
        return _LoadScorerAndCost(name)

    registry = _registry()
    registry.register("counted", _NoParams, factory)
    data = _spec(scorers=[{"ref": "twice"}], cost_model="twice")
    data["plugins"].append({"type": "counted", "name": "twice"})
    profile = registry.build(load_profile_spec(data), tier=Tier.ZONE)
    assert built == ["twice"]
    assert profile.weights == (("twice", 1.0),)
    assert profile.cost_model is not None
    assert profile.cost_model.name == profile.scorers[0].scorer.name == "twice"


@pytest.mark.parametrize(
    ("case", "profile", "message"),
    [
        ("missing picker", {"picker": None}, r"profile\.picker: missing"),
        ("empty picker list", {"picker": []}, r"profile\.picker: missing"),
        (
            "two pickers",
            {"picker": ["max-score-picker", "coin"]},
            r"profile\.picker: 2 pickers \(max-score-picker, coin\); a profile has exactly one",
        ),
        (
            "zero weight",
            {"scorers": [{"ref": "load", "weight": 0}]},
            r"profile\.scorers\.0\.weight: Input should be greater than 0",
        ),
        (
            "negative weight",
            {"scorers": [{"ref": "ttft"}, {"ref": "load", "weight": -1}]},
            r"profile\.scorers\.1\.weight: Input should be greater than 0",
        ),
        (
            "nan weight",
            {"scorers": [{"ref": "load", "weight": "nan"}]},
            r"profile\.scorers\.0\.weight: Input should be a finite number",
        ),
        (
            "a name that is no identifier",
            {"filters": ["Not_An_Id"]},
            r"profile\.filters\.0: .*a lowercase id",
        ),
        (
            "infinite weight",
            {"scorers": [{"ref": "load", "weight": "inf"}]},
            r"profile\.scorers\.0\.weight: Input should be a finite number",
        ),
        (
            "huge weight",
            {"scorers": [{"ref": "load", "weight": 1e9}]},
            r"profile\.scorers\.0\.weight: Input should be less than or equal to 1000000",
        ),
        (
            "unknown filter ref",
            {"filters": ["nope"]},
            r"profile\.filters\[0\]: unknown plugin 'nope'",
        ),
        (
            "unknown scorer ref",
            {"scorers": [{"ref": "x"}]},
            r"scorers\[0\]\.ref: unknown plugin 'x'",
        ),
        ("unknown picker ref", {"picker": "best"}, r"profile\.picker: unknown plugin 'best'"),
        ("unknown cost ref", {"cost_model": "c"}, r"profile\.cost_model: unknown plugin 'c'"),
        ("picker as filter", {"filters": ["coin"]}, r"filters\[0\]: plugin 'coin' .* not a filter"),
        ("filter as picker", {"picker": "allowed"}, r"picker: plugin 'allowed' .* not a picker"),
        ("scorer without cost", {"cost_model": "load"}, r"'load' .* not a cost_model plugin"),
        (
            "same scorer twice",
            {"scorers": [{"ref": "load"}, {"ref": "load"}]},
            r"plugin names must be unique: \['load', 'load'\]",
        ),
    ],
)
def test_profile_errors_name_the_plugin_and_field(
    case: str, profile: dict[str, Any], message: str
) -> None:
    with pytest.raises(PluginError, match=message):
        _build(_spec(**profile))


@pytest.mark.parametrize(
    ("case", "plugin", "message"),
    [
        ("unknown type", {"type": "magic"}, r"plugins\[5\] 'magic': unknown plugin type 'magic'"),
        (
            "bad parameter value",
            {"type": "weighted-random-picker", "name": "w", "parameters": {"seed": "x"}},
            r"plugins\[5\] 'w' \(type 'weighted-random-picker'\): parameters\.seed: Input should",
        ),
        (
            "unknown parameter",
            {"type": "max-score-picker", "name": "m2", "parameters": {"temperature": 1}},
            r"'m2' \(type 'max-score-picker'\): parameters\.temperature: Extra inputs",
        ),
        (
            "invalid combination",
            {"type": "allow-list-filter", "name": "al"},
            r"'al' \(type 'allow-list-filter'\): parameters: Value error, set ids",
        ),
        (
            "duplicate name",
            {"type": "random-picker", "name": "coin"},
            r"plugins\[5\] 'coin': duplicate",
        ),
    ],
)
def test_plugin_errors_name_the_plugin_and_field(
    case: str, plugin: dict[str, Any], message: str
) -> None:
    data = _spec()
    data["plugins"].append(plugin)
    with pytest.raises(PluginError, match=message):
        _build(data)


def test_invalid_profile_shape_is_a_plugin_error_naming_the_field() -> None:
    with pytest.raises(PluginError, match=r"plugins\.0\.type: Field required"):
        load_profile_spec({"plugins": [{"name": "x"}], "profile": {}})
    with pytest.raises(PluginError, match=r"profile\.scorers\.0\.wieght: Extra inputs"):
        load_profile_spec({"profile": {"scorers": [{"ref": "a", "wieght": 2}]}})


def test_factory_failure_is_a_plugin_error_naming_the_plugin() -> None:
    registry = default_registry()

    def factory(name: str, params: _NoParams) -> object:
        raise ValueError("needs a GPU profile table")

    registry.register("fussy", _NoParams, factory)
    spec = ProfileSpec.model_validate({"plugins": [{"type": "fussy"}], "profile": {}})
    with pytest.raises(PluginError, match=r"plugins\[0\] 'fussy' \(type 'fussy'\): needs a GPU"):
        registry.build(spec, tier=Tier.GLOBAL)


def test_deprecated_alias_builds_the_current_type_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gtm.routing.registry"):
        plugin = default_registry().build_plugin(
            load_profile_spec({"plugins": [{"type": "random"}], "profile": {}}).plugins[0]
        )
    assert isinstance(plugin, RandomPicker)
    assert plugin.name == "random"
    assert "'random' is deprecated; use 'random-picker'" in caplog.text


def test_a_deprecated_alias_is_logged_once_per_registry(caplog: pytest.LogCaptureFixture) -> None:
    registry = default_registry()
    spec = load_profile_spec({"plugins": [{"type": "random"}], "profile": {}}).plugins[0]
    with caplog.at_level(logging.WARNING, logger="gtm.routing.registry"):
        registry.build_plugin(spec)
        registry.build_plugin(spec)
    assert caplog.text.count("is deprecated") == 1


def test_the_vocabulary_aliases_name_the_registered_types_only() -> None:
    registry = default_registry()
    registry.register("health-filter", _NoParams, lambda n, p: object())
    registry.register_vocabulary_aliases()
    assert registry.aliases() == {"healthy-filter": "health-filter", "random": "random-picker"}
    assert set(VOCABULARY_ALIASES) >= {"serves-model-filter", "ttft-cost", "prefix-cache-scorer"}


def test_fast_paths_are_declared_on_the_registry_and_copied_with_it() -> None:
    registry = default_registry()
    path = FastPath("p", Stage.CHOICE, (), lambda match: MaxScorePicker())  # type: ignore[arg-type,return-value]
    registry.register_fast_path(path)
    with pytest.raises(PluginError, match="already registered"):
        registry.register_fast_path(path)
    assert registry.copy().fast_paths() == (path,)
    assert default_registry().fast_paths() == ()


def test_registration_rules() -> None:
    registry = default_registry()
    with pytest.raises(PluginError, match="already registered"):
        registry.register("max-score-picker", _NoParams, lambda n, p: object())
    with pytest.raises(PluginError, match="already registered"):
        registry.register("random", _NoParams, lambda n, p: object())
    with pytest.raises(PluginError, match="unknown plugin type 'gone'"):
        registry.register_alias("old", "gone")
    with pytest.raises(PluginError, match="already registered"):
        registry.register_alias("random", "max-score-picker")

    class Loose(BaseModel):
        x: int = 0

    with pytest.raises(PluginError, match="must be frozen and forbid extra fields"):
        registry.register("loose", Loose, lambda n, p: object())


def test_registries_are_independent() -> None:
    first, second = default_registry(), default_registry()
    first.register("extra", _NoParams, lambda n, p: object())
    clone = first.copy()
    clone.register("clone-only", _NoParams, lambda n, p: object())
    assert "extra" in first.type_names()
    assert "extra" not in second.type_names()
    assert "extra" in clone.type_names()
    assert "clone-only" not in first.type_names()
    assert default_registry().type_names() == (
        "allow-list-filter",
        "max-score-picker",
        "power-of-two-picker",
        "random-picker",
        "weighted-random-picker",
    )
    assert default_registry().aliases() == {"random": "random-picker"}


def test_trace_scores_reaches_the_profile() -> None:
    data = _spec(scorers=[{"ref": "load"}])
    data["trace_scores"] = 1
    profile = _build(data)
    candidates = (Node("a", load=0.5), Node("b", load=0.1), Node("c", load=0.9))
    decision = profile.decide(batch(*candidates)).to_decision()
    assert [s.candidate for s in decision.trace.scores] == ["b"]
    assert decision.trace.scores_omitted == 2
    with pytest.raises(PluginError, match=r"trace_scores: Input should be greater than or equal"):
        load_profile_spec({**data, "trace_scores": -1})


def test_plugin_timing_every_reaches_the_profile() -> None:
    data = _spec()
    assert _build(data).plugin_timing_every == DEFAULT_PLUGIN_TIMING_EVERY
    assert _build({**data, "plugin_timing_every": 1}).plugin_timing_every == 1
    with pytest.raises(PluginError, match=r"plugin_timing_every: Input should be greater"):
        load_profile_spec({**data, "plugin_timing_every": 0})


def test_spec_is_frozen_and_plugin_name_defaults_to_type() -> None:
    spec = load_profile_spec(_spec())
    assert spec.plugins[3].plugin_name == "max-score-picker"
    assert spec.plugins[0].plugin_name == "allowed"
    with pytest.raises(ValueError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from gtm.errors import PluginError
from gtm.metrics import new_registry
from gtm.policy_store import ActivePolicy, activate
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.registry import ProfileSpec, load_profile_spec
from policies.loader import load_examples
from zone_agent.flow import check_profile
from zone_agent.profiles import (
    BUILTIN_PROFILES,
    DEFAULT_PROFILE,
    ZONE_ALIASES,
    build_zone_profile,
    builtin_profile,
    profile_source,
    zone_registry,
)

from .helpers import Gpu, make_request, make_view

BASELINES = {
    "round-robin",
    "random",
    "least-connections",
    "weighted-round-robin",
    "least-pending-tokens",
    "power-of-two",
    "consistent-hash",
    "consistent-hash-bounded",
    "sglang-cache-aware",
    "llm-d-blend",
    "dynamo-cost",
}


def test_default_and_every_baseline_of_the_issue_are_built_in() -> None:
    assert set(BUILTIN_PROFILES) == BASELINES | {DEFAULT_PROFILE, "goodput", "ttft-only"}


@pytest.mark.parametrize("name", sorted(BUILTIN_PROFILES))
def test_every_builtin_decides_and_predicts(name: str) -> None:
    view = make_view([Gpu("a"), Gpu("b", gpu_type="A100-80GB")])
    decision = builtin_profile(name).decide(make_request(), view)
    assert decision.gpu_id in ("a", "b")
    assert decision.predicted_ttft_ms is not None
    assert decision.to_decision().trace.profile == name


def test_default_profile_shape() -> None:
    p = builtin_profile(DEFAULT_PROFILE)
    assert [f.name for f in p.runner.filters] == ["health", "model", "fits", "canary"]
    assert p.weights == (("zone-ttft", 1.0), ("kv-cache", 1.0))
    assert p.runner.picker.name == "max-score"
    assert p.runner.cost_model is not None
    assert p.runner.cost_model.name == "zone-ttft"


def test_llm_d_blend_weights() -> None:
    p = builtin_profile("llm-d-blend")
    assert p.weights == (
        ("prefix-affinity-scorer", 3.0),
        ("queue-scorer", 2.0),
        ("kv-cache-scorer", 2.0),
    )


def _spec(**profile: Any) -> Any:
    plugins = [
        {"type": "healthy-filter"},
        {"type": "ttft-cost", "name": "ttft"},
        {"type": "max-score-picker"},
    ]
    body = {"filters": ["healthy-filter"], "picker": "max-score-picker", **profile}
    return load_profile_spec({"name": "custom", "plugins": plugins, "profile": body})


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"filters": ["nope"]}, "unknown plugin 'nope'"),
        ({"filters": ["ttft"]}, "is not a filter"),
        ({"picker": "ttft"}, "is not a picker"),
        ({"picker": ["max-score-picker", "max-score-picker"]}, "exactly one picker"),
        ({"picker": None}, "exactly one picker"),
        ({"filters": []}, "health-filter"),
        ({"scorers": [{"ref": "healthy-filter", "weight": 1}]}, "is not a scorer"),
        ({"cost_model": "healthy-filter"}, "is not a cost_model plugin"),
    ],
)
def test_configuration_errors_name_the_field(profile: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginError, match=message):
        build_zone_profile(_spec(**profile))


def test_unknown_plugin_type_and_bad_parameters() -> None:
    spec = load_profile_spec(
        {"plugins": [{"type": "warp-drive"}], "profile": {"picker": "warp-drive"}}
    )
    with pytest.raises(PluginError, match="unknown plugin type 'warp-drive'"):
        build_zone_profile(spec)
    spec = load_profile_spec(
        {
            "plugins": [{"type": "ttft-cost", "parameters": {"scale_ms": -1}}],
            "profile": {"picker": "ttft-cost"},
        }
    )
    with pytest.raises(PluginError, match="scale_ms"):
        build_zone_profile(spec, zone_registry())


def test_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(PluginError, match="round-robin"):
        builtin_profile("fastest")


# ------------------------------------------------------------ policy files, vocabulary


def _example_spec(name: str) -> ProfileSpec:
    return load_profile_spec(load_examples().profile_config(name))


def test_the_example_zone_default_builds_and_is_the_builtin_default() -> None:
    spec = _example_spec("zone-default")
    profile = build_zone_profile(spec)
    assert profile.runner.fast_paths == ("fused-filters", "blend-pick")
    assert spec.model_copy(update={"name": DEFAULT_PROFILE}) == BUILTIN_PROFILES[DEFAULT_PROFILE]


def test_the_example_zone_goodput_builds_and_is_the_builtin_goodput() -> None:
    spec = _example_spec("zone-goodput")
    assert build_zone_profile(spec).runner.fast_paths == ("fused-filters", "slo-blend-pick")
    assert spec.model_copy(update={"name": "goodput"}) == BUILTIN_PROFILES["goodput"]


def test_old_type_names_build_the_same_profile_and_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = {
        "healthy-filter": "health",
        "serves-model-filter": "model",
        "fits-filter": "fits",
        "canary-filter": "canary",
        "ttft-cost": "zone-ttft",
        "kv-cache-utilization-scorer": "kv-cache",
        "max-score-picker": "max-score",
    }
    data = BUILTIN_PROFILES[DEFAULT_PROFILE].model_dump(mode="json")
    for plugin in data["plugins"]:
        plugin["type"] = next(t for t, n in old.items() if n == plugin["name"])
    with caplog.at_level(logging.WARNING):
        profile = build_zone_profile(load_profile_spec(data))
    assert "'healthy-filter' is deprecated; use 'health-filter'" in caplog.text
    assert profile.runner.fast_paths == ("fused-filters", "blend-pick")
    view = make_view([Gpu("a"), Gpu("b", gpu_type="A100-80GB")])
    request = make_request()
    assert (
        profile.decide(request, view).gpu_id
        == builtin_profile("default").decide(request, view).gpu_id
    )
    # The baselines' names before the vocabulary, as scorers under max-score (the way
    # profiles used the one-hot baselines) and as the pickers they now are.
    registry = zone_registry()
    for alias, current in ZONE_ALIASES.items():
        assert registry.plugin_type(alias).type_name == current


def test_a_third_scorer_loses_the_blend_fast_path_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = BUILTIN_PROFILES[DEFAULT_PROFILE].model_dump(mode="json")
    data["plugins"].append({"type": "queue-scorer", "name": "queue"})
    data["profile"]["scorers"].append({"ref": "queue", "weight": 1.0})
    registry = new_registry()
    with caplog.at_level(logging.INFO):
        profile = build_zone_profile(load_profile_spec(data), metrics=RoutingMetrics(registry))
    assert profile.runner.fast_paths == ("fused-filters",)
    assert "blend-pick: scorer 'queue' (QueueScorer) is one more than it takes (2)" in caplog.text

    def gauge(path: str) -> float | None:
        labels = {"tier": "zone", "profile": "default", "path": path}
        return registry.get_sample_value("gtm_routing_fast_path", labels)

    assert (gauge("fused-filters"), gauge("blend-pick"), gauge("cheapest-pick")) == (1, 0, 0)
    view = make_view([Gpu("a"), Gpu("b", gpu_type="A100-80GB")])
    assert profile.decide(make_request(), view).outcome.scored is not None  # scored one by one


def _policy(generation: int, zone_default: Mapping[str, Any] | None) -> ActivePolicy:
    policy_set = load_examples()
    if zone_default is not None:
        profiles = dict(policy_set.profiles)
        found = profiles["zone-default"]
        profiles["zone-default"] = type(found).model_validate(
            {**found.model_dump(), **zone_default}
        )
        policy_set = dataclasses.replace(policy_set, profiles=profiles)
    return activate(generation, policy_set)


def test_the_profile_follows_the_policy_files() -> None:
    metrics = RoutingMetrics(new_registry())
    source = profile_source(metrics=metrics)
    assert source.name == "zone-default"
    assert source.current.weights == (("zone-ttft", 1.0), ("kv-cache", 1.0))
    # A policy whose zone-default weighs KV room more: rebuilt on the new generation.
    heavier = {"scorers": ({"ref": "zone-ttft", "weight": 1.0}, {"ref": "kv-cache", "weight": 3.0})}
    assert source.update(_policy(2, heavier)).weights == (("zone-ttft", 1.0), ("kv-cache", 3.0))
    # A broken one is refused; the one in force stays.
    broken = {"filters": ("model",)}
    assert source.update(_policy(3, broken)).weights == (("zone-ttft", 1.0), ("kv-cache", 3.0))
    # Another built-in by name: zone-<name> in the policy, else the built-in.
    assert profile_source("ttft-only", policy=_policy(4, None)).current.name == "ttft-only"


def test_a_check_refuses_a_policys_profile_and_keeps_the_one_in_force(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Flow control needs a TTFT prediction: under it, a policy whose zone-default has
    # no cost model is refused like one that does not build, logged and counted.
    registry = new_registry()
    source = profile_source(metrics=RoutingMetrics(registry), check=check_profile)
    no_ttft = {"scorers": ({"ref": "kv-cache", "weight": 1.0},), "cost_model": None}
    with caplog.at_level(logging.ERROR):
        kept = source.update(_policy(2, no_ttft))
    assert kept.runner.cost_model is not None
    assert kept.weights == (("zone-ttft", 1.0), ("kv-cache", 1.0))
    assert "--admission slo needs a profile that predicts TTFT" in caplog.text
    labels = {"tier": "zone", "profile": "zone-default"}
    assert registry.get_sample_value("gtm_routing_profile_reload_failures_total", labels) == 1.0
    # Without flow control the same policy applies.
    assert profile_source(check=None).update(_policy(2, no_ttft)).runner.cost_model is None

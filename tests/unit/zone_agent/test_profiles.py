from __future__ import annotations

from typing import Any

import pytest

from gtm.errors import PluginError
from gtm.routing.registry import load_profile_spec
from zone_agent.profiles import (
    BUILTIN_PROFILES,
    DEFAULT_PROFILE,
    build_zone_profile,
    builtin_profile,
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
    assert set(BUILTIN_PROFILES) == BASELINES | {DEFAULT_PROFILE, "ttft-only"}


@pytest.mark.parametrize("name", sorted(BUILTIN_PROFILES))
def test_every_builtin_decides_and_predicts(name: str) -> None:
    view = make_view([Gpu("a"), Gpu("b", gpu_type="A100-80GB")])
    decision = builtin_profile(name).decide(make_request(), view)
    assert decision.gpu_id in ("a", "b")
    assert decision.predicted_ttft_ms is not None
    assert decision.to_decision().trace.profile == name


def test_default_profile_shape() -> None:
    p = builtin_profile(DEFAULT_PROFILE)
    assert [f.name for f in p.filters] == [
        "healthy-filter",
        "serves-model-filter",
        "fits-filter",
        "canary-filter",
    ]
    assert p.weights == (("ttft", 1.0), ("kv-cache", 1.0))
    assert p.picker.name == "max-score-picker"
    assert p.cost_model is not None
    assert p.cost_model.name == "ttft"


def test_llm_d_blend_weights() -> None:
    p = builtin_profile("llm-d-blend")
    assert p.weights == (
        ("prefix-cache-scorer", 3.0),
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
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
        ({"filters": []}, "healthy-filter"),
        ({"scorers": [{"ref": "healthy-filter", "weight": 1}]}, "is not a scorer"),
        ({"cost_model": "healthy-filter"}, "is not a cost model"),
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

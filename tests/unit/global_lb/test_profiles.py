from __future__ import annotations

import pytest

from global_lb import profiles
from global_lb.plugins import global_registry
from gtm.errors import ConfigError
from tests.unit.global_lb.helpers import example_policy


def test_policy_profile_is_used_when_present() -> None:
    spec = profiles.profile_spec(
        example_policy(), "global-default", profiles.DEFAULT_REQUEST_PROFILE
    )
    profile = profiles.build(global_registry(), spec, None)
    assert profile.filter_names == ("residency", "health", "model")
    assert profile.picker_name == "max-score"


def test_builtin_defaults_without_a_policy_profile() -> None:
    spec = profiles.profile_spec(example_policy(), "global-dns", profiles.DEFAULT_DNS_PROFILE)
    profile = profiles.build(global_registry(), spec, None)
    assert profile.filter_names == ("residency", "health")
    assert profile.picker_name == "spread"


def test_a_profile_without_residency_is_refused() -> None:
    data = dict(profiles.DEFAULT_REQUEST_PROFILE)
    data["profile"] = {**data["profile"], "filters": ["health", "model"]}
    with pytest.raises(ConfigError, match="must run a 'residency-filter'"):
        profiles.profile_spec(None, "x", data)


def test_a_profile_for_another_tier_is_refused() -> None:
    with pytest.raises(ConfigError, match="tier 'regional'"):
        profiles.profile_spec(
            example_policy(), "regional-default", profiles.DEFAULT_REQUEST_PROFILE
        )


def test_bad_plugin_parameters_are_config_errors() -> None:
    data = {**profiles.DEFAULT_REQUEST_PROFILE, "plugins": [
        *profiles.DEFAULT_REQUEST_PROFILE["plugins"][:-1],
        {"type": "headroom-spread-picker", "name": "spread", "parameters": {"saturation": 3}},
    ]}  # fmt: skip
    spec = profiles.profile_spec(None, "x", data)
    with pytest.raises(ConfigError, match="saturation"):
        profiles.build(global_registry(), spec, None)

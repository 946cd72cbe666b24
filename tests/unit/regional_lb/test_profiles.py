from __future__ import annotations

from pathlib import Path

import pytest

from gtm.errors import ConfigError
from regional_lb.profiles import (
    DEFAULT_PROFILE,
    build,
    profile_spec,
    regional_registry,
    with_saturation_last,
)
from tests.unit.regional_lb.policy_fixtures import policy


def test_the_default_profile_ends_with_the_saturation_filter() -> None:
    spec = profile_spec(None)
    assert spec.profile.filters == ("residency", "health", "model", "saturation")
    assert build(spec).name == DEFAULT_PROFILE["name"]
    assert with_saturation_last(spec) == spec  # idempotent


def test_the_example_policy_profile_builds(tmp_path: Path) -> None:
    active = policy(tmp_path)
    spec = profile_spec(active)
    assert spec.profile.filters[-1] == "saturation"
    assert [s.ref for s in spec.profile.scorers] == ["ttft", "prefix-affinity"]
    build(spec)
    # Every plugin type the example policy names is registered at this tier.
    named = {p.type for p in active.policy_set.plugins.values()}
    assert named <= set(regional_registry().type_names())


def test_a_profile_for_another_tier_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tier 'zone'"):
        profile_spec(policy(tmp_path), "zone-default")

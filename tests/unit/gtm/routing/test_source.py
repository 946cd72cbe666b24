"""ProfileSource: a tier's profile from the policy files, hot-reloaded, the last good one
kept when a new one fails."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.models import Tier
from gtm.policy_store import ActivePolicy, activate
from gtm.routing import ProfileSource, ProfileSpec, RoutingMetrics, policy_profile_spec
from policies.loader import load_paths

DEFAULT = {
    "name": "zone-default",
    "plugins": [{"type": "max-score-picker"}],
    "profile": {"picker": "max-score-picker"},
}

ROUTING = """\
apiVersion: gtm.dev/v1
kind: RoutingProfiles
metadata: {{name: test}}
spec:
  plugins:
    - {{type: {picker}, name: pick}}
  profiles:
    - {{name: zone-default, tier: {tier}, picker: pick}}
"""


def policy(tmp_path: Path, generation: int, picker: str, tier: str = "zone") -> ActivePolicy:
    path = tmp_path / f"routing-{generation}.yaml"
    path.write_text(ROUTING.format(picker=picker, tier=tier))
    return activate(generation, load_paths([path]))


def source(metrics: RoutingMetrics | None = None) -> tuple[ProfileSource[str], list[str]]:
    built: list[str] = []

    def build(spec: ProfileSpec) -> str:
        kind = spec.plugins[0].type
        if kind == "broken-picker":
            raise ConfigError("unknown plugin type 'broken-picker'")
        built.append(kind)
        return kind

    return ProfileSource(Tier.ZONE, "zone-default", DEFAULT, build, metrics=metrics), built


def test_the_default_stands_until_a_policy_names_the_profile(tmp_path: Path) -> None:
    profiles, built = source()
    assert profiles.current == "max-score-picker"
    assert profiles.update(None) == "max-score-picker"
    assert profiles.update(policy(tmp_path, 1, "random-picker")) == "random-picker"
    assert profiles.generation == 1
    assert built == ["max-score-picker", "random-picker"]


def test_a_new_generation_rebuilds_only_when_the_profile_changed(tmp_path: Path) -> None:
    profiles, built = source()
    first = policy(tmp_path, 1, "random-picker")
    profiles.update(first)
    profiles.update(first)  # the same generation: one comparison, nothing rebuilt
    profiles.update(policy(tmp_path, 2, "random-picker"))  # same profile, new generation
    assert profiles.update(policy(tmp_path, 3, "power-of-two-picker")) == "power-of-two-picker"
    assert built == ["max-score-picker", "random-picker", "power-of-two-picker"]


def test_a_profile_that_fails_keeps_the_last_good_one_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = new_registry()
    profiles, _ = source(RoutingMetrics(registry))
    profiles.update(policy(tmp_path, 1, "random-picker"))
    with caplog.at_level(logging.ERROR, logger="gtm.routing.source"):
        kept = profiles.update(policy(tmp_path, 2, "broken-picker"))
        again = profiles.update(policy(tmp_path, 2, "broken-picker"))
    assert kept == again == "random-picker"
    assert "generation 2 not applied; keeping the one in force" in caplog.text
    labels = {"tier": "zone", "profile": "zone-default"}
    assert registry.get_sample_value("gtm_routing_profile_reload_failures_total", labels) == 1.0
    assert profiles.update(policy(tmp_path, 3, "power-of-two-picker")) == "power-of-two-picker"


def test_a_profile_of_another_tier_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is for tier 'global'"):
        policy_profile_spec(
            policy(tmp_path, 1, "random-picker", "global"), Tier.ZONE, "zone-default", DEFAULT
        )
    assert policy_profile_spec(None, Tier.ZONE, "zone-default", DEFAULT).name == "zone-default"

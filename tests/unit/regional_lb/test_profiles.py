from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gtm.errors import ConfigError
from gtm.metrics import new_registry
from gtm.policy_store import ActivePolicy
from gtm.routing import RoutingMetrics
from policies.documents import SaturationPolicy
from regional_lb.profiles import (
    DEFAULT_PROFILE,
    build,
    profile_source,
    profile_spec,
    regional_registry,
    with_saturation_last,
)
from regional_lb.router import Inputs, RegionalRouter, Route
from tests.unit.regional_lb.helpers import NOW, model_load, route_request, view, zone
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
    # Every plugin type the example's regional profiles use is registered at this tier.
    policy_set = active.policy_set
    named = {
        policy_set.plugins[ref].type
        for profile in policy_set.profiles.values()
        if profile.tier.value == "regional"
        for ref in profile.refs()
    }
    assert named <= set(regional_registry().type_names())


def test_a_profile_for_another_tier_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tier 'zone'"):
        profile_spec(policy(tmp_path), "zone-default")


def test_the_router_follows_the_policy_of_its_view(tmp_path: Path) -> None:
    """Hot reload: a new policy generation's profile decides from the next decision on;
    one that does not build leaves the last good one in force (counted)."""
    registry = new_registry()
    router = RegionalRouter(profile_source(metrics=RoutingMetrics(registry)))
    # Zone a is idle but has no hot prefix; zone b holds the prompt's prefix, queued.
    zones = [
        zone("a", model_load(queued=0)),
        zone("b", model_load(queued=20_000), sketch=(1, 2, 3, 4)),
    ]
    request = route_request(tokens=100, prefix=(1, 2, 3, 4))
    inputs = Inputs(allowed=frozenset({"r1"}), on_saturation=SaturationPolicy.REJECT)

    def choice(active: ActivePolicy | None) -> str:
        regional = dataclasses.replace(view(zones), policy=active)
        decided = router.decide(request, regional, inputs, accounting=None, now=NOW, now_wall=NOW)
        assert decided.route is Route.LOCAL
        assert decided.zone is not None
        return decided.zone.id

    assert choice(None) == "a"  # the built-in default: TTFT carries the decision
    affinity = policy(tmp_path / "1", regional_scorer="prefix-affinity-scorer")
    assert choice(affinity) == "b"  # both scorers now pull toward the hot prefix
    broken = dataclasses.replace(
        policy(tmp_path / "2", regional_scorer="no-such-scorer"), generation=2
    )
    assert choice(broken) == "b"  # the last good profile stays
    labels = {"tier": "regional", "profile": "regional-default"}
    assert registry.get_sample_value("gtm_routing_profile_reload_failures_total", labels) == 1.0

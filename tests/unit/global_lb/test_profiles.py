from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from global_lb import profiles
from global_lb.app import GlobalConfig, build_routers
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from global_lb.view import RequestContext
from gtm.errors import ConfigError
from gtm.models import ClientInfo, GeoPoint, RouteRequest
from gtm.policy_store import ActivePolicy, activate
from gtm.routing import RoutingMetrics
from policies import load_paths
from policies.loader import examples_path
from tests.unit.global_lb.helpers import MODEL, example_policy, view


def test_policy_profile_is_used_when_present() -> None:
    spec = profiles.profile_spec(
        example_policy(), "global-default", profiles.DEFAULT_REQUEST_PROFILE
    )
    profile = profiles.build(global_registry(), spec, None)
    assert tuple(f.name for f in profile.filters) == ("residency", "health", "model")
    assert profile.picker.name == "spread"
    # The example's global-default is the built-in default.
    assert spec == profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)


def test_builtin_defaults_without_a_policy_profile() -> None:
    spec = profiles.profile_spec(example_policy(), "global-dns", profiles.DEFAULT_DNS_PROFILE)
    profile = profiles.build(global_registry(), spec, None)
    assert tuple(f.name for f in profile.filters) == ("residency", "health")
    assert profile.picker.name == "spread"


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


def _with_global_default(
    tmp_path: Path, name: str, generation: int, **changes: Any
) -> ActivePolicy:
    """The example policies with the global-default profile changed, as ``generation``."""
    directory = tmp_path / name
    shutil.copytree(examples_path(), directory)
    path = directory / "routing-profiles.yaml"
    document = yaml.safe_load(path.read_text())
    for profile in document["spec"]["profiles"]:
        if profile["name"] == "global-default":
            profile.update(changes)
    path.write_text(yaml.safe_dump(document))
    return activate(generation, load_paths([directory]))


def test_routers_follow_a_hot_reloaded_profile(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = GlobalConfig()
    router, dns = build_routers(example_policy(), config, None)
    assert router.profile.picker.name == "spread"
    london = RouteRequest(
        request_id="r1",
        model=MODEL,
        input_tokens=100,
        tenant="demo-global",
        client=ClientInfo(country="GB", location=GeoPoint(lat=51.5, lon=-0.1)),
    )
    assert router.decide(london, view()).region == "eu-west"
    # Generation 2 weighs load alone: the view built on it brings the new profile.
    load_only = _with_global_default(tmp_path, "load", 2, scorers=[{"ref": "load", "weight": 1.0}])
    reloaded = view(policy=load_only, revision=2)
    router.decide(london, reloaded)
    assert [ref.ref for ref in router.spec.profile.scorers] == ["load"]
    assert router.fast_paths == ("global-filters", "global-spread-choice")  # built again
    dns_spec = dns.spec
    dns.choose_region(
        london, reloaded, RequestContext(reloaded, frozenset({"eu-west"}), None, "GB")
    )
    assert dns.spec == dns_spec  # the policy has no global-dns profile: the default stays
    # Generation 3 names a profile the global tier cannot run: logged, the last one stays.
    broken = _with_global_default(tmp_path, "broken", 3, filters=["health", "model"])
    with caplog.at_level(logging.ERROR, logger="gtm.routing.source"):
        outcome = router.decide(london, view(policy=broken, revision=3))
    assert outcome.region is not None
    assert [ref.ref for ref in router.spec.profile.scorers] == ["load"]
    assert "'global-default' of policy generation 3 not applied" in caplog.text
    assert "residency-filter" in caplog.text


def test_earlier_plugin_names_are_aliases_with_the_same_plugins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    renamed = {"health-filter": "healthy-filter", "model-filter": "serves-model-filter",
               "ttft-scorer": "ttft-cost"}  # fmt: skip
    data = dict(profiles.DEFAULT_REQUEST_PROFILE)
    data["plugins"] = [{**p, "type": renamed.get(p["type"], p["type"])} for p in data["plugins"]]
    with caplog.at_level(logging.WARNING, logger="gtm.routing.registry"):
        old = profiles.build(global_registry(), profiles.profile_spec(None, "x", data), None)
    new = profiles.build(
        global_registry(),
        profiles.profile_spec(None, "x", profiles.DEFAULT_REQUEST_PROFILE),
        None,
    )
    assert [type(f) for f in old.filters] == [type(f) for f in new.filters]
    assert [type(w.scorer) for w in old.scorers] == [type(w.scorer) for w in new.scorers]
    assert old.fast_paths == new.fast_paths == ("global-filters", "global-spread-choice")
    assert "plugin type 'healthy-filter' is deprecated; use 'health-filter'" in caplog.text


def test_plugins_are_timed_on_few_decisions_unless_the_profile_says() -> None:
    registry = CollectorRegistry()
    metrics = RoutingMetrics(registry)
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    router = GlobalRouter(profiles.build(global_registry(), spec, metrics), spec, cache_size=0)
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=10, tenant="demo-global")
    for _ in range(100):
        router.decide(request, view())
    labels = {"tier": "global", "extension_point": "scorer", "plugin": "ttft"}
    timed = registry.get_sample_value("gtm_routing_plugin_duration_seconds_count", labels)
    assert timed == 1.0  # the first of 4,096 (profiles.PLUGIN_TIMING_EVERY)
    every = profiles.profile_spec(
        None, "x", {**profiles.DEFAULT_REQUEST_PROFILE, "plugin_timing_every": 10}
    )
    router = GlobalRouter(profiles.build(global_registry(), every, metrics), every, cache_size=0)
    for _ in range(100):
        router.decide(request, view())
    timed = registry.get_sample_value("gtm_routing_plugin_duration_seconds_count", labels)
    assert timed == 11.0

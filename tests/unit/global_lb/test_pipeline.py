from __future__ import annotations

import ipaddress
from typing import Any

from global_lb import profiles
from global_lb.geo import Location, LocationSource
from global_lb.pipeline import compile_pipeline
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from gtm.models import GeoPoint, RouteRequest
from gtm.routing import load_profile_spec
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, load, summary, view

LONDON = GeoPoint(lat=51.51, lon=-0.09)


def spec_with(**changes: Any) -> Any:
    data = dict(profiles.DEFAULT_REQUEST_PROFILE)
    data.update(changes)
    return load_profile_spec(data)


def routers(spec: Any) -> tuple[GlobalRouter, GlobalRouter]:
    built = profiles.build(global_registry(), spec, None)
    return (
        GlobalRouter(built, spec, cache_size=0),
        GlobalRouter(built, spec, cache_size=0, fast_path=False),
    )


def london() -> Location:
    return Location("GB", LONDON, ipaddress.ip_network("192.0.2.0/24"), LocationSource.DATABASE)


def test_default_profiles_compile_and_unknown_plugins_fall_back() -> None:
    assert compile_pipeline(spec_with()) is not None
    plugins = [*profiles.DEFAULT_REQUEST_PROFILE["plugins"], {"type": "allow-list-filter",
               "name": "allow", "parameters": {"allowed": ["eu-west"]}}]  # fmt: skip
    profile = dict(profiles.DEFAULT_REQUEST_PROFILE["profile"])
    profile["filters"] = [*profile["filters"], "allow"]
    assert compile_pipeline(spec_with(plugins=plugins, profile=profile)) is None
    assert compile_pipeline(spec_with(trace_scores=2)) is None


def test_saturation_boundary_spreads_like_the_picker() -> None:
    # Headroom exactly 1 - saturation (0.15 of 100 running slots): the picker spreads.
    busy = [summary(r, load(running=85)) for r in REGION_IDS]
    fast, slow = routers(spec_with())
    spread = 0
    for rid in ("a", "b", "c", "d", "e", "f", "g", "h"):
        request = RouteRequest(request_id=rid, model=MODEL, input_tokens=10, tenant="demo-global")
        a = fast.decide(request, view(summaries=busy), london())
        b = slow.decide(request, view(summaries=busy), london())
        assert (a.region, a.fallbacks, a.scores) == (b.region, b.fallbacks, b.scores)
        spread += "spread" in a.reasons
    assert spread > 0


def test_fast_decision_builds_its_trace_only_when_read() -> None:
    fast, slow = routers(spec_with())
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=10, tenant="demo-global")
    v = view()
    outcome = fast.decide(request, v, london())
    source = outcome.trace_source
    assert source is not None
    assert source._trace is None  # not built yet
    assert outcome.trace == slow.decide(request, v, london()).trace
    assert outcome.trace is outcome.trace  # built once

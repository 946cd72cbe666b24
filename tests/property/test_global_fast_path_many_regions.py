"""Property: over the 50 Azure regions (real coordinates, data/latency), the
global fast path (the fused ttft + load pass, per-mask gathers, client rows; spread and
max-score pickers; weights that make the load term matter or not) chooses what the
generic profile chooses, with the same fallbacks, scores and predicted TTFT, and the
same first retries when they are read first (the front door's order of reading). The
other property test runs on six regions; this one on the fleet size the global tier's
latency target is set for (issue 7)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from global_lb import profiles
from global_lb.geo import Location, LocationSource
from global_lb.health import HealthTable
from global_lb.keeper import build_view
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from global_lb.view import GlobalView, LatencyModel
from gtm.models import ClientInfo, GeoPoint, ModelLoad, RegionSummary, RouteRequest
from gtm.policy_store import ActivePolicy
from gtm.routing import load_profile_spec
from gtm.state.snapshot import FleetSnapshot
from gtm.testing.azure import azure_regions_policy
from tests.property.test_global_fast_path import _same
from tests.unit.global_lb.helpers import MODEL

AZURE = Path(__file__).resolve().parents[2] / "data" / "latency" / "azure_regions.csv"
REGIONS = 50


@pytest.fixture(scope="module")
def azure() -> ActivePolicy:
    return azure_regions_policy(AZURE, REGIONS)


def _fused(load_weight: float, scale_ms: float, picker: str) -> Mapping[str, Any]:
    """A ttft + load profile (the fused pass) with these weights and picker."""
    data = dict(profiles.DEFAULT_REQUEST_PROFILE)
    plugins = [dict(p) for p in data["plugins"]]
    for plugin in plugins:
        if plugin["type"] == "ttft-scorer":
            plugin["parameters"] = {"scale_ms": scale_ms}
    plugins.append({"type": "max-score-picker", "name": "max"})
    data["plugins"] = plugins
    data["profile"] = {
        **data["profile"],
        "scorers": [{"ref": "ttft", "weight": 1.0}, {"ref": "load", "weight": load_weight}],
        "picker": picker,
    }
    return data


SPECS = [
    profiles.DEFAULT_REQUEST_PROFILE,
    profiles.DEFAULT_DNS_PROFILE,
    _fused(0.2, 100.0, "max"),
    _fused(1.0, 20.0, "max"),
    _fused(5.0, 300.0, "spread"),
    _fused(0.01, 50.0, "max"),
]


def _routers(data: Mapping[str, Any]) -> tuple[GlobalRouter, GlobalRouter]:
    spec = load_profile_spec(dict(data))
    build = profiles.build(global_registry(), spec, None)
    return GlobalRouter(build, spec, cache_size=0), GlobalRouter(
        build, spec, cache_size=0, fast_path=False
    )


ROUTERS = [_routers(s) for s in SPECS]

loads = st.builds(
    lambda running, queued, prefill: ModelLoad(
        model=MODEL,
        gpus=8,
        healthy_gpus=8,
        prefill_tokens_per_s=prefill,
        queued_prefill_tokens=queued,
        running_requests=running,
        max_running_requests=256,
    ),
    running=st.integers(0, 256),
    queued=st.sampled_from([0, 0, 1_000, 20_000, 200_000, 2_000_000]),
    prefill=st.sampled_from([40_000.0, 40_000.0, 90_000.0]),
)


def _view(policy: ActivePolicy, found: Mapping[str, ModelLoad], down: set[str]) -> GlobalView:
    summaries = {
        rid: RegionSummary(region_id=rid, published_at=1.0, models=(load,))
        for rid, load in found.items()
    }
    snapshot = FleetSnapshot(revision=1, region_summaries=MappingProxyType(summaries))
    status = {rid: (rid not in down, "refused" if rid in down else "") for rid in found}
    health = HealthTable(1, MappingProxyType(status), False)
    return build_view(policy, snapshot, health, latency=LatencyModel())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(SPECS) - 1),
    tenant=st.sampled_from(["demo-global", "demo-eu", "acme-health"]),
    lat=st.floats(-60, 70, allow_nan=False),
    lon=st.floats(-179, 179, allow_nan=False),
    country=st.sampled_from(["GB", "DE", "US", "JP", "BR", "IN", "AU"]),
    tokens=st.integers(0, 60_000),
    data=st.data(),
    rid=st.text("abcdef0123456789", min_size=1, max_size=8),
)
def test_many_regions_fast_path_decides_like_the_profile(
    azure: ActivePolicy,
    which: int,
    tenant: str,
    lat: float,
    lon: float,
    country: str,
    tokens: int,
    data: st.DataObject,
    rid: str,
) -> None:
    ids = sorted(azure.policy_set.regions)
    found = data.draw(st.fixed_dictionaries({r: loads for r in ids}))
    down = data.draw(st.sets(st.sampled_from(ids), max_size=5))
    v = _view(azure, found, down)
    point = GeoPoint(lat=lat, lon=lon)
    request = RouteRequest(
        request_id=rid,
        model=MODEL,
        input_tokens=tokens,
        tenant=tenant,
        client=ClientInfo(country=country, location=point),
    )
    location = Location(
        country, point, ipaddress.ip_network("192.0.2.0/24"), LocationSource.DATABASE
    )
    fast, slow = ROUTERS[which]
    expected = slow.decide(request, v, location)
    # The first retries, read before anything else (the front door's order of reading).
    assert fast.decide(request, v, location).targets(3) == expected.targets(3)
    _same(fast.decide(request, v, location), expected)

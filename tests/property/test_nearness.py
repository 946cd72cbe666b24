"""Property (issue 22, item 2): on an idle fleet where every region has a free GPU of the
model's fastest class, the nearest allowed region wins, for every prompt size — however
many slower GPUs each region has beside it.

The summaries go through the real chain: each zone's from the zone agent's
``build_summary`` over idle emulated GPUs, each region's from the regional LB's
``build_summary`` over its zones, and the global router decides over those.
"""

from __future__ import annotations

import ipaddress
from types import MappingProxyType

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from global_lb import profiles
from global_lb.geo import Location, LocationSource
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from gtm.gpu_profiles import get_profile
from gtm.models import GeoPoint, RegionSummary, RouteRequest, ZoneSummary
from regional_lb.summary import build_summary as region_summary
from regional_lb.view import RegionalView, ZoneInfo
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, view
from tests.unit.zone_agent.helpers import Gpu, make_view
from zone_agent.summary import build_summary as zone_summary

#: The GPU types with a profile for MODEL; the fastest per-GPU prefill rate among them.
TYPES = ("H100", "H200", "A100-80GB", "A100-40GB", "L40S", "L4", "V100")
RATES = {t: get_profile(t, MODEL).prefill_tokens_per_s for t in TYPES}
FASTEST = tuple(t for t in TYPES if RATES[t] == max(RATES.values()))

COUNTRIES = ["GB", "SE", "DE", "FR", "US", "JP", "SG", "BR", "IN", "AU"]
TENANTS = ["demo-global", "demo-eu", "acme-health"]

#: A zone: one GPU of the fastest class (or none), and some slower ones.
zones = st.tuples(st.booleans(), st.lists(st.sampled_from(TYPES), max_size=3))
#: A region: one to three zones, at least one with a fastest-class GPU (fixed below).
regions = st.lists(zones, min_size=1, max_size=3)


def router() -> GlobalRouter:
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    return GlobalRouter(profiles.build(global_registry(), spec, None), spec, cache_size=0)


ROUTER = router()


def idle_zone(region: str, index: int, gpu_types: list[str]) -> ZoneSummary:
    gpus = [Gpu(f"g{k}", gpu_type=t, running=0.0) for k, t in enumerate(gpu_types)]
    built = zone_summary(make_view(gpus), published_at=1.0)
    return built.model_copy(update={"zone_id": f"{region}-{index}", "region_id": region})


def idle_region(region: str, drawn: list[tuple[bool, list[str]]], fastest: str) -> RegionSummary:
    drawn = [(fast or i == 0, slow) for i, (fast, slow) in enumerate(drawn)]
    infos = {}
    for i, (fast, slow) in enumerate(drawn):
        types = ([fastest] if fast else []) + slow
        if not types:
            continue
        summary = idle_zone(region, i, types)
        infos[summary.zone_id] = ZoneInfo(summary.zone_id, summary, False, "http://z", 2.0)
    regional = RegionalView(region, 1, None, MappingProxyType(infos), MappingProxyType({}))
    return region_summary(regional, None, published_at=1.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fleet=st.fixed_dictionaries({rid: regions for rid in REGION_IDS}),
    fastest=st.sampled_from(FASTEST),
    tenant=st.sampled_from(TENANTS),
    country=st.sampled_from(COUNTRIES),
    lat=st.floats(-60, 70),
    lon=st.floats(-179, 179),
    tokens=st.integers(0, 120_000),
)
def test_the_nearest_allowed_region_wins_on_an_idle_fleet(
    fleet: dict[str, list[tuple[bool, list[str]]]],
    fastest: str,
    tenant: str,
    country: str,
    lat: float,
    lon: float,
    tokens: int,
) -> None:
    summaries = [idle_region(rid, drawn, fastest) for rid, drawn in fleet.items()]
    world = view(summaries=summaries)
    point = GeoPoint(lat=lat, lon=lon)
    where = Location(country, point, ipaddress.ip_network("192.0.2.0/24"), LocationSource.DATABASE)
    request = RouteRequest(model=MODEL, input_tokens=tokens, tenant=tenant)
    outcome = ROUTER.decide(request, world, where)
    if not outcome.allowed:
        return  # residency allows nothing for this client: a refusal, not this property
    distances = {rid: point.distance_km(world.by_id[rid].location) for rid in outcome.allowed}
    nearest = min(distances.values())
    assert outcome.region is not None
    # The nearest wins (a region as near, to the metre, may win the tie).
    assert distances[outcome.region] - nearest < 1e-3, (outcome.region, distances)

"""The built-in ``global-nearest`` request profile (``rtt-scorer`` alone): the nearest
region residency allows, whatever the regions' load, as the simulator's zone-agent
baselines choose a region."""

from __future__ import annotations

import ipaddress

from global_lb import profiles
from global_lb.config import GlobalConfig
from global_lb.geo import Location, LocationSource
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from gtm.models import GeoPoint, RouteRequest
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, load, summary, view

LONDON = GeoPoint(lat=51.51, lon=-0.09)
SEATTLE = GeoPoint(lat=47.6, lon=-122.3)


def located(country: str, point: GeoPoint) -> Location:
    return Location(country, point, ipaddress.ip_network("192.0.2.0/24"), LocationSource.DATABASE)


def request(tenant: str = "demo-global") -> RouteRequest:
    return RouteRequest(request_id="r1", model=MODEL, input_tokens=500, tenant=tenant)


def router(name: str) -> GlobalRouter:
    spec = profiles.profile_spec(None, name, profiles.request_default(name))
    return GlobalRouter(profiles.build(global_registry(), spec, None), spec, cache_size=0)


def test_the_nearest_region_wins_however_loaded() -> None:
    busy = summary("eu-west", load(running=50, queued=400_000, prefill=20_000))
    others = [summary(r, load()) for r in REGION_IDS if r != "eu-west"]
    fleet = view(summaries=[busy, *others])
    # gtm's default prices eu-west by its queue and sends London elsewhere ...
    assert router("global-default").decide(request(), fleet, located("GB", LONDON)).region != (
        "eu-west"
    )
    # ... the nearest-region profile does not look at load.
    outcome = router("global-nearest").decide(request(), fleet, located("GB", LONDON))
    assert outcome.region == "eu-west"


def test_residency_and_health_still_filter_first() -> None:
    nearest = router("global-nearest")
    drained = nearest.decide(request(), view(drained=["eu-west"]), located("GB", LONDON))
    assert drained.region is not None
    assert drained.region != "eu-west"
    # demo-eu is pinned to the EU: a Seattle client gets the nearest EU region, not
    # us-west.
    eu = nearest.decide(request("demo-eu"), view(), located("US", SEATTLE))
    assert eu.region in {"eu-west", "eu-central"}


def test_unknown_names_keep_the_default_profile() -> None:
    assert profiles.request_default("global-nearest") is profiles.NEAREST_REQUEST_PROFILE
    assert profiles.request_default("from-the-policy-set") is profiles.DEFAULT_REQUEST_PROFILE
    assert GlobalConfig().profile == profiles.REQUEST_PROFILE_NAME

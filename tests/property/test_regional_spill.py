"""Property: the regional LB never spills a request outside its residency-allowed set,
and never spills one whose residency says ``on_saturation: reject`` — whatever the
policies, the saturation of the region and its peers, the hops and the spill chain.

Random residency policies (allow and deny rules per tenant and client country, random
``on_saturation``) are compiled by the real engine; random fleet states (zones full or
not, healthy or not, drained; peers with or without room, healthy, spilling out, with
stale summaries) are routed by the real regional router.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from gtm.models import ModelLoad, RegionSummary, RouteRequest, ZoneSummary
from policies.documents import (
    JurisdictionsDocument,
    RegionsDocument,
    ResidencyDocument,
    SaturationPolicy,
    TenantsDocument,
)
from policies.policyset import LoadedDocument, build_policy_set
from policies.residency import ResidencyQuery, compile
from regional_lb.profiles import build, profile_spec
from regional_lb.router import Inputs, RegionalRouter, Route, RouterSettings
from regional_lb.spill import SpillLimiter
from regional_lb.view import PeerInfo, RegionalView, ViewSettings, ZoneInfo

REGIONS = {
    "us-east": ("US", 39.0, -77.5),
    "us-west": ("US", 45.8, -119.7),
    "eu-west": ("IE", 53.3, -6.3),
    "eu-central": ("DE", 50.1, 8.7),
    "ap-northeast": ("JP", 35.7, 139.7),
    "ap-southeast": ("SG", 1.4, 103.8),
}
COUNTRIES = ["US", "IE", "DE", "JP", "SG", "FR"]
TENANTS = ["t1", "t2"]
MODEL = "m"
NOW = 1_000.0

PROPERTY_SETTINGS = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _doc(model: type[Any], kind: str, spec: dict[str, Any]) -> LoadedDocument:
    data = {"apiVersion": "gtm.dev/v1", "kind": kind, "metadata": {"name": "gen"}, "spec": spec}
    return LoadedDocument(source=f"{kind}.yaml", document=model.model_validate(data))


@st.composite
def policies(draw: st.DrawFn) -> Any:
    rules: list[dict[str, Any]] = [
        {
            "name": "base",
            "effect": "allow",
            "all_regions": True,
            "on_saturation": draw(st.sampled_from(["reject", "spill_within_allowed"])),
        }
    ]
    for i, tenant in enumerate(TENANTS):
        if draw(st.booleans()):
            rules.append(
                {
                    "name": f"allow-{i}",
                    "effect": "allow",
                    "match": {"tenants": [tenant]},
                    "regions": draw(
                        st.lists(st.sampled_from(list(REGIONS)), min_size=1, unique=True)
                    ),
                    "on_saturation": draw(
                        st.sampled_from([None, "reject", "spill_within_allowed"])
                    ),
                }
            )
    for i in range(draw(st.integers(0, 3))):
        rules.append(
            {
                "name": f"deny-{i}",
                "effect": "deny",
                "match": {
                    "client_countries": draw(
                        st.lists(st.sampled_from(COUNTRIES), min_size=1, max_size=2, unique=True)
                    )
                },
                "countries": draw(
                    st.lists(st.sampled_from(COUNTRIES), min_size=1, max_size=2, unique=True)
                ),
                "outside": draw(st.booleans()),
            }
        )
    policy_set = build_policy_set(
        [
            _doc(
                JurisdictionsDocument,
                "Jurisdictions",
                {"jurisdictions": [{"id": "anywhere", "countries": COUNTRIES}]},
            ),
            _doc(
                RegionsDocument,
                "Regions",
                {
                    "regions": [
                        {"id": r, "country": c, "location": {"lat": lat, "lon": lon}}
                        for r, (c, lat, lon) in REGIONS.items()
                    ]
                },
            ),
            _doc(TenantsDocument, "Tenants", {"tenants": [{"id": t} for t in TENANTS]}),
            _doc(
                ResidencyDocument,
                "Residency",
                {
                    "unknown_client_location": {"action": "assume", "jurisdiction": "anywhere"},
                    "rules": rules,
                },
            ),
        ]
    )
    return compile(policy_set)


def _mostly() -> st.SearchStrategy[bool]:
    return st.sampled_from([True, True, True, False])


def _load(draw: st.DrawFn, *, full: bool) -> ModelLoad:
    gpus = draw(st.integers(1, 4))
    healthy = draw(st.sampled_from([gpus, gpus, gpus, 0]))
    capacity = 8 * gpus
    return ModelLoad(
        model=MODEL,
        gpus=gpus,
        healthy_gpus=healthy,
        prefill_tokens_per_s=10_000.0 * gpus,
        queued_prefill_tokens=draw(st.integers(0, 50_000)),
        running_requests=capacity if full else draw(st.integers(0, capacity - 1)),
        waiting_requests=100 if full else 0,
        max_running_requests=capacity,
    )


@st.composite
def views(draw: st.DrawFn, region: str) -> RegionalView:
    zones = {}
    for i in range(draw(st.integers(0, 3))):
        zone_id = f"{region}-{i}"
        summary = ZoneSummary(
            zone_id=zone_id,
            region_id=region,
            published_at=NOW,
            healthy=draw(_mostly()),
            models=(_load(draw, full=draw(_mostly())),) if draw(_mostly()) else (),
        )
        drained = not draw(_mostly())
        zones[zone_id] = ZoneInfo(zone_id, summary, drained, f"http://{zone_id}", 2.0)
    peers = {}
    for peer in REGIONS:
        if peer == region:
            continue
        # Mostly usable peers, so that spills actually happen and are checked.
        peer_summary: RegionSummary | None = None
        if draw(_mostly()):
            peer_summary = RegionSummary(
                region_id=peer,
                published_at=NOW - draw(st.sampled_from([0.0, 1.0, 1.0, 60.0])),
                healthy=draw(_mostly()),
                models=(_load(draw, full=False),) if draw(_mostly()) else (),
                saturation=draw(st.floats(0.0, 1.0)),
                spill_out_per_s=draw(st.sampled_from([0.0, 0.0, 0.0, 3.0])),
            )
        url = f"http://{peer}" if draw(_mostly()) else None
        peers[peer] = PeerInfo(peer, peer_summary, not draw(_mostly()), url, 50.0)
    return RegionalView(
        region=region,
        snapshot_revision=1,
        policy=None,
        zones=MappingProxyType(zones),
        peers=MappingProxyType(peers),
        region_drained=not draw(_mostly()),
        settings=ViewSettings(),
    )


@dataclass(frozen=True)
class Case:
    engine: Any
    view: RegionalView
    query: ResidencyQuery
    hops: int
    spilled_from: tuple[str, ...]
    rate_limited: bool


@st.composite
def cases(draw: st.DrawFn) -> Case:
    region = draw(st.sampled_from(list(REGIONS)))
    query = ResidencyQuery(
        tenant=draw(st.sampled_from(TENANTS)),
        model=MODEL,
        client_country=draw(st.none() | st.sampled_from(COUNTRIES)),
    )
    chain = draw(st.lists(st.sampled_from(list(REGIONS)), max_size=1, unique=True))
    return Case(
        draw(policies()),
        draw(views(region)),
        query,
        draw(st.sampled_from([0, 0, 1, 1, 2, 3])),
        tuple(chain),
        draw(st.booleans()),
    )


ROUTER_SETTINGS = RouterSettings(spill_requires_client_country=False)
PROFILE = build(profile_spec(None))


@PROPERTY_SETTINGS
@given(cases(), st.integers(0, 2**32 - 1))
def test_spills_stay_inside_the_allowed_set_and_reject_is_honoured(case: Case, seed: int) -> None:
    verdict = case.engine.allowed_regions(case.query)
    limiter = SpillLimiter(ROUTER_SETTINGS.spill)
    if case.rate_limited:
        for peer in REGIONS:
            while limiter.allow(peer, NOW):
                pass
    router = RegionalRouter(
        PROFILE, saturation_filter="saturation", settings=ROUTER_SETTINGS, limiter=limiter
    )
    request = RouteRequest(
        request_id=f"r{seed}", model=MODEL, input_tokens=500, tenant=case.query.tenant
    )
    inputs = Inputs(
        allowed=verdict.allowed,
        on_saturation=verdict.on_saturation,
        hops=case.hops,
        spilled_from=case.spilled_from,
        client_country_known=case.query.client_country is not None,
    )
    decision = router.decide(request, case.view, inputs, accounting=None, now=NOW, now_wall=NOW)
    region = case.view.region
    if region not in verdict.allowed:
        assert decision.route is Route.REFUSE
    if decision.route is Route.SPILL:
        assert decision.peer is not None
        for option in (decision.peer, *decision.fallbacks):
            assert option.region in verdict.allowed
            assert option.region != region
            assert option.region not in case.spilled_from
        assert verdict.on_saturation is SaturationPolicy.SPILL_WITHIN_ALLOWED
        assert case.hops < ROUTER_SETTINGS.spill.max_hops
        assert not case.rate_limited
    if decision.route is Route.LOCAL:
        assert decision.zone is not None
        assert decision.zone.id in case.view.zones
        assert not decision.zone.drained


@settings(PROPERTY_SETTINGS, max_examples=100)
@given(cases())
def test_unknown_client_location_never_spills_by_default(case: Case) -> None:
    verdict = case.engine.allowed_regions(case.query)
    router = RegionalRouter(PROFILE, saturation_filter="saturation")
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=500, tenant=case.query.tenant)
    inputs = Inputs(
        allowed=verdict.allowed,
        on_saturation=verdict.on_saturation,
        hops=case.hops,
        spilled_from=case.spilled_from,
        client_country_known=False,
    )
    decision = router.decide(request, case.view, inputs, accounting=None, now=NOW, now_wall=NOW)
    assert decision.route is not Route.SPILL


def _route(case: Case) -> Route:
    verdict = case.engine.allowed_regions(case.query)
    router = RegionalRouter(PROFILE, saturation_filter="saturation", settings=ROUTER_SETTINGS)
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=500, tenant=case.query.tenant)
    inputs = Inputs(
        allowed=verdict.allowed,
        on_saturation=verdict.on_saturation,
        hops=case.hops,
        spilled_from=case.spilled_from,
        client_country_known=True,
    )
    return router.decide(request, case.view, inputs, accounting=None, now=NOW, now_wall=NOW).route


def test_the_generated_cases_do_spill() -> None:
    """The properties above are not vacuous: the generator reaches every route."""
    # No shrinking: the first example found is proof enough, and shrinking is slow.
    quick = settings(database=None, derandomize=True, phases=[Phase.generate], max_examples=2000)
    for route in Route:
        example = find(cases(), partial(_routes_to, route), settings=quick)
        assert _route(example) is route


def _routes_to(route: Route, case: Case) -> bool:
    return _route(case) is route

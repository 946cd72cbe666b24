"""Property: whatever the health, drains, load and client, the global tier never chooses,
falls back to, or answers in DNS a region outside the residency-allowed set."""

from __future__ import annotations

import ipaddress

import dns.message
import dns.rcode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from global_lb import profiles
from global_lb.dns.responder import Responder
from global_lb.dns.rrl import RrlConfig
from global_lb.dns.zone import ZoneConfig
from global_lb.geo import ChainLocator, CidrEntry, CidrMap, Location, LocationSource
from global_lb.metrics import GlobalMetrics
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from gtm.clock import FakeClock
from gtm.metrics import new_registry
from gtm.models import GeoPoint, RouteRequest
from policies import ResidencyQuery
from tests.unit.global_lb.helpers import (
    MODEL,
    REGION_IDS,
    address_of,
    example_policy,
    load,
    summary,
    view,
)

COUNTRIES = ["GB", "SE", "DE", "FR", "US", "JP", "SG", "BR", None]
TENANTS = ["demo-global", "demo-eu", "acme-health", "unknown-tenant"]
DATA_CLASSES = ["default", "de-only"]

regions_subset = st.sets(st.sampled_from(REGION_IDS))
points = st.one_of(
    st.none(),
    st.builds(
        GeoPoint,
        lat=st.floats(-80, 80, allow_nan=False),
        lon=st.floats(-179, 179, allow_nan=False),
    ),
)


def router(cache: int) -> GlobalRouter:
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    return GlobalRouter(profiles.build(global_registry(), spec, None), spec, cache_size=cache)


ROUTERS = (router(0), router(1024))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tenant=st.sampled_from(TENANTS),
    country=st.sampled_from(COUNTRIES),
    point=points,
    data_class=st.sampled_from(DATA_CLASSES),
    down=regions_subset,
    drained=regions_subset,
    running=st.dictionaries(st.sampled_from(REGION_IDS), st.integers(0, 120)),
    rid=st.text("abcdef0123456789", min_size=1, max_size=8),
    cached=st.booleans(),
)
def test_requests_never_leave_the_allowed_set(
    tenant: str,
    country: str | None,
    point: GeoPoint | None,
    data_class: str,
    down: set[str],
    drained: set[str],
    running: dict[str, int],
    rid: str,
    cached: bool,
) -> None:
    summaries = [
        summary(r, load(running=min(n, 100), waiting=max(0, n - 100))) for r, n in running.items()
    ]
    v = view(summaries=summaries, down=down, drained=drained)
    request = RouteRequest(
        request_id=rid, model=MODEL, input_tokens=100, tenant=tenant, data_class=data_class
    )
    location = Location(
        country, point, ipaddress.ip_network("192.0.2.0/24"), LocationSource.DATABASE
    )
    outcome = ROUTERS[cached].decide(request, v, location)
    verdict = example_policy().engine.allowed_regions(
        ResidencyQuery(tenant, MODEL, data_class, country)
    )
    assert outcome.verdict.allowed == verdict.allowed
    if outcome.region is None:
        assert outcome.refusal is not None
        assert outcome.fallbacks == ()
        return
    chosen = {outcome.region, *outcome.fallbacks}
    assert chosen <= verdict.allowed
    assert chosen.isdisjoint(down | drained)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    country=st.sampled_from(COUNTRIES),
    down=regions_subset,
    drained=regions_subset,
    name=st.sampled_from(
        ["api", "eu.api", "us.api", "jp.api", "eea.api", "eu-west.api", "us-east.api"]
    ),
)
def test_dns_never_answers_outside_the_allowed_regions(
    country: str | None, down: set[str], drained: set[str], name: str
) -> None:
    entries = (
        []
        if country is None
        else [CidrEntry(network=ipaddress.ip_network("192.0.2.0/24"), country=country)]
    )
    current = view(down=down, drained=drained)
    spec = profiles.profile_spec(None, "global-dns", profiles.DEFAULT_DNS_PROFILE)
    responder = Responder(
        ZoneConfig(),
        view=lambda: current,
        router=GlobalRouter(profiles.build(global_registry(), spec, None), spec, cache_size=0),
        locator=ChainLocator(None, CidrMap(entries)),
        metrics=GlobalMetrics(new_registry()),
        clock=FakeClock(),
        rrl=RrlConfig(rate=0),
    )
    query = dns.message.make_query(f"{name}.inference.example.", "A")
    raw = responder.respond(query.to_wire(), ipaddress.ip_address("192.0.2.1"))
    assert raw is not None
    reply = dns.message.from_wire(raw)
    assert reply.rcode() == dns.rcode.NOERROR
    answered = {r.to_text() for rrset in reply.answer for r in rrset}
    policy = example_policy()
    allowed: set[str] = set()
    for tenant in policy.policy_set.tenants:
        allowed |= policy.engine.allowed_regions(
            ResidencyQuery(tenant, "gtm:any-model", "default", country)
        ).allowed
    permitted = {address_of(r) for r in allowed - down - drained}
    assert answered <= permitted
    if not answered:
        assert reply.authority  # NODATA carries the SOA

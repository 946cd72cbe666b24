from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

import pytest

from global_lb import profiles
from global_lb.geo import Location, LocationSource
from global_lb.plugins import global_registry
from global_lb.router import (
    GlobalRouter,
    Refusal,
    RouteOutcome,
    cell_of,
    spread_slot,
    token_bucket,
)
from gtm.models import ClientInfo, GeoPoint, RouteRequest
from gtm.routing import load_profile_spec
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, load, summary, view

LONDON = GeoPoint(lat=51.51, lon=-0.09)
STOCKHOLM = GeoPoint(lat=59.33, lon=18.06)
SEATTLE = GeoPoint(lat=47.6, lon=-122.3)


def located(country: str | None, point: GeoPoint | None) -> Location:
    return Location(country, point, ipaddress.ip_network("192.0.2.0/24"), LocationSource.DATABASE)


def request(
    tenant: str = "demo-global", model: str = MODEL, rid: str = "r1", **kw: Any
) -> RouteRequest:
    return RouteRequest(request_id=rid, model=model, input_tokens=500, tenant=tenant, **kw)


def test_nearest_region_wins_and_fallbacks_are_ranked(router: GlobalRouter) -> None:
    outcome = router.decide(request(), view(), located("GB", LONDON))
    assert outcome.region == "eu-west"
    assert outcome.fallbacks[0] == "eu-central"
    assert set(outcome.fallbacks) == set(outcome.allowed) - {"eu-west"}
    assert outcome.http_status == 200
    assert outcome.reasons == ("residency:allowed",)
    assert outcome.predicted_ttft_ms is not None
    assert outcome.predicted_ttft_ms < 60


@pytest.mark.parametrize(
    ("tenant", "country", "point", "allowed"),
    [
        ("demo-global", "SE", STOCKHOLM, {"eu-west", "eu-central"}),  # GDPR: EEA only
        ("demo-eu", "US", SEATTLE, {"eu-west", "eu-central"}),  # tenant pinned to the EU
        ("acme-health", "US", SEATTLE, {"us-east", "us-west"}),
    ],
)
def test_choice_and_fallbacks_stay_inside_the_allowed_set(
    router: GlobalRouter, tenant: str, country: str, point: GeoPoint, allowed: set[str]
) -> None:
    outcome = router.decide(request(tenant), view(), located(country, point))
    assert set(outcome.allowed) == allowed
    assert outcome.region in allowed
    assert set(outcome.fallbacks) <= allowed


def test_residency_refusal_is_451_with_the_reason(router: GlobalRouter) -> None:
    outcome = router.decide(request("acme-health"), view(), located("SE", STOCKHOLM))
    assert outcome.refusal is Refusal.RESIDENCY
    assert outcome.http_status == 451
    assert outcome.region is None
    assert outcome.fallbacks == ()
    assert outcome.reasons == ("residency:denied", "refused:residency")
    assert "gdpr-stays-in-eea" in outcome.detail


def test_unknown_tenant_is_refused(router: GlobalRouter) -> None:
    outcome = router.decide(request("nobody"), view(), located("GB", LONDON))
    assert outcome.refusal is Refusal.RESIDENCY
    assert outcome.verdict.reason.value == "unknown-tenant"


def test_all_allowed_regions_down_is_503_never_outside(router: GlobalRouter) -> None:
    outcome = router.decide(
        request("demo-eu"), view(down=["eu-west", "eu-central"]), located("GB", LONDON)
    )
    assert outcome.refusal is Refusal.NO_AVAILABLE_REGION
    assert outcome.http_status == 503
    assert outcome.region is None
    assert outcome.trace is not None
    assert outcome.trace.filters[-1].plugin == "health"


def test_model_served_nowhere_allowed_is_404(router: GlobalRouter) -> None:
    summaries = [summary(r, load(model="other/model")) for r in ("eu-west", "eu-central")]
    outcome = router.decide(request("demo-eu"), view(summaries=summaries), located("GB", LONDON))
    assert outcome.refusal is Refusal.MODEL_NOT_SERVED
    assert outcome.http_status == 404


def test_a_listed_model_with_no_healthy_gpu_now_is_a_retryable_503(router: GlobalRouter) -> None:
    # Every allowed region lists the model, none has a healthy GPU for it now (all down,
    # or their zones' scrapes lapsed while etcd was starved): the model exists, the
    # capacity does not — a retryable 503, not "model not found".
    summaries = [summary(r, load(healthy_gpus=0)) for r in ("eu-west", "eu-central")]
    outcome = router.decide(request("demo-eu"), view(summaries=summaries), located("GB", LONDON))
    assert outcome.refusal is Refusal.NO_AVAILABLE_REGION
    assert outcome.http_status == 503


def test_drained_region_takes_no_new_requests(router: GlobalRouter) -> None:
    outcome = router.decide(request(), view(drained=["eu-west"]), located("GB", LONDON))
    assert outcome.region == "eu-central"
    assert outcome.trace is not None
    assert ("eu-west", "drained") in outcome.trace.filters[1].reasons


def test_loaded_region_loses_to_an_idle_neighbour(router: GlobalRouter) -> None:
    busy = summary("eu-west", load(running=50, queued=400_000, prefill=20_000))
    others = [summary(r, load()) for r in REGION_IDS if r != "eu-west"]
    outcome = router.decide(request(), view(summaries=[busy, *others]), located("GB", LONDON))
    assert outcome.region == "eu-central"


def test_decisions_are_cached_per_view_revision(router: GlobalRouter) -> None:
    first = view(revision=1)
    a = router.decide(request(rid="a"), first, located("GB", LONDON))
    b = router.decide(request(rid="a"), first, located("GB", LONDON))
    assert (a.cached, b.cached) == (False, True)
    assert b.region == a.region
    assert b.decision_id == "a"
    moved = view(revision=2, down=["eu-west"])
    c = router.decide(request(rid="a"), moved, located("GB", LONDON))
    assert (c.cached, c.region) == (False, "eu-central")


def test_cache_off_runs_the_profile_every_time() -> None:
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    router = GlobalRouter(profiles.build(global_registry(), spec, None), spec, cache_size=0)
    v = view()
    assert not router.decide(request(), v, located("GB", LONDON)).cached
    assert not router.decide(request(), v, located("GB", LONDON)).cached


def test_location_defaults_to_the_request_client(router: GlobalRouter) -> None:
    outcome = router.decide(request(client=ClientInfo(country="US", location=SEATTLE)), view())
    assert outcome.region == "us-west"


def test_unknown_location_uses_the_policy_assumption(router: GlobalRouter) -> None:
    outcome = router.decide(request(), view(), located(None, None))
    assert outcome.verdict.assumed_jurisdiction == "world"
    assert outcome.region is not None


def test_outcome_json_has_the_decision_api_fields(router: GlobalRouter) -> None:
    data = router.decide(request(), view(), located("GB", LONDON)).to_json()
    assert {"decision_id", "region", "fallbacks", "allowed", "scores", "reasons", "trace"} <= set(
        data
    )
    assert data["client"]["country"] == "GB"
    assert [f["plugin"] for f in data["trace"]["filters"]] == ["residency", "health", "model"]


def test_cache_key_helpers() -> None:
    assert cell_of(None, None) is None
    assert cell_of(LONDON, "GB") == ("GB", 103, 0)
    assert token_bucket(0) == token_bucket(63) == 0
    assert token_bucket(64) < token_bucket(128) < token_bucket(100_000)
    assert 0 <= spread_slot("x") < 16


def test_verdicts_are_the_engines_and_follow_a_new_policy_generation(
    router: GlobalRouter,
) -> None:
    from dataclasses import replace

    from gtm.policy_store import activate
    from policies import ResidencyQuery, load_examples

    first = view()
    got = router.verdict(request(tenant="demo-eu"), first, "SE")
    assert got == first.policy.engine.allowed_regions(
        ResidencyQuery("demo-eu", MODEL, "default", "SE")
    )
    assert router.verdict(request(tenant="demo-eu"), first, "SE") is got  # remembered
    # A new generation brings a new engine: its verdicts, not the remembered ones.
    newer = replace(first, policy=activate(2, load_examples()))
    again = router.verdict(request(tenant="demo-eu"), newer, "SE")
    assert again == newer.policy.engine.allowed_regions(
        ResidencyQuery("demo-eu", MODEL, "default", "SE")
    )
    assert again is not got


def test_per_conversation_affinity_is_part_of_the_cache_key() -> None:
    # Two conversations of one tenant may have different home regions: a cached decision
    # for the first must not be served to the second (it was, before the key held the
    # conversation).
    spec = load_profile_spec(
        {
            "name": "global-default",
            "plugins": [
                {"type": "residency-filter", "name": "residency"},
                {"type": "health-filter", "name": "health"},
                {"type": "model-filter", "name": "model"},
                {
                    "type": "tenant-affinity-scorer",
                    "name": "home",
                    "parameters": {"per_conversation": True},
                },
                {"type": "max-score-picker", "name": "max"},
            ],
            "profile": {
                "filters": ["model", "residency", "health"],
                "scorers": [{"ref": "home"}],
                "picker": "max",
            },
        }
    )
    build = profiles.build(global_registry(), spec, None)
    cached = GlobalRouter(build, spec)
    uncached = GlobalRouter(build, spec, cache_size=0)
    v = view(summaries=[summary(r, load(running=10)) for r in REGION_IDS])
    where = located("US", SEATTLE)
    homes = set()
    for conversation in range(12):
        req = request(rid=f"c{conversation}", prefix_hashes=(1000 + conversation, 7))
        region = cached.decide(req, v, where).region
        assert region == uncached.decide(req, v, where).region
        homes.add(region)
    assert len(homes) > 1  # conversations of one tenant really have different homes


def test_decisions_independent_of_the_prompt_size_are_cached_across_sizes() -> None:
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    built = profiles.build(global_registry(), spec, None)
    where = Location(
        "GB",
        GeoPoint(lat=51.5, lon=-0.1),
        ipaddress.ip_network("192.0.2.0/24"),
        LocationSource.DATABASE,
    )

    def pair(gpus: list[int]) -> tuple[RouteOutcome, RouteOutcome, RouteOutcome]:
        loads = [summary(r, load(gpus=g, queued=5_000 * i)) for i, (r, g) in
                 enumerate(zip(REGION_IDS, gpus, strict=True))]  # fmt: skip
        v = view(summaries=loads)
        cached = GlobalRouter(built, spec)
        small = RouteRequest(request_id="a", model=MODEL, input_tokens=100, tenant="demo-global")
        big = small.model_copy(update={"request_id": "b", "input_tokens": 3_000})
        cached.decide(small, v, where)
        uncached = GlobalRouter(built, spec, cache_size=0).decide(big, v, where)
        return cached.decide(big, v, where), uncached, cached.decide(small, v, where)

    # Same GPUs everywhere: a prompt adds the same prefill time to every region's cost,
    # so the choice holds for every size; the predicted TTFT is the request's own.
    big, uncached, small = pair([4] * len(REGION_IDS))
    assert big.cached
    assert small.cached
    assert (big.region, big.predicted_ttft_ms) == (uncached.region, uncached.predicted_ttft_ms)
    assert small.predicted_ttft_ms is not None
    assert big.predicted_ttft_ms is not None
    assert small.predicted_ttft_ms < big.predicted_ttft_ms
    # Different GPUs per region: the size can change the choice; another bucket misses.
    big, uncached, _ = pair([1, 2, 4, 8, 2, 1])
    assert not big.cached
    assert (big.region, big.predicted_ttft_ms) == (uncached.region, uncached.predicted_ttft_ms)


def test_outcomes_built_through_the_slots_equal_the_constructors(router: GlobalRouter) -> None:
    # The router builds each RouteOutcome through its slot setters (router._outcome):
    # every field must land where the dataclass constructor puts it.
    decided = router.decide(request(), view(), located("GB", LONDON))
    values = {f.name: getattr(decided, f.name) for f in dataclasses.fields(RouteOutcome)}
    rebuilt = RouteOutcome(**values)
    assert rebuilt == decided
    assert all(getattr(rebuilt, name) is value for name, value in values.items())
    assert decided.region == "eu-west"
    assert decided.view_revision
    assert decided.decision_id == "r1"

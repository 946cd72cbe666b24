"""Property: the global tier's fast paths (global_lb.pipeline) and the runner's reference
(the plugins one by one) choose the same region, the same fallbacks in the same order,
the same scores, predicted TTFT and refusal, on random views, requests and profiles — so
the two can never drift apart."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from global_lb import profiles
from global_lb.geo import Location, LocationSource
from global_lb.inflight import InflightLedger, LedgerSettings
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter, RouteOutcome
from global_lb.view import ANY_MODEL, LatencyModel, RequestContext
from gtm.models import ClientInfo, GeoPoint, ModelLoad, RegionSummary, RouteRequest
from gtm.routing import load_profile_spec
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, example_policy, summary, view

OTHER_MODEL = "other/model"
COUNTRIES = ["GB", "SE", "DE", "US", "JP", "SG", "BR", None]
TENANTS = ["demo-global", "demo-eu", "acme-health"]


def _profile(picker: Mapping[str, Any], scorers: list[dict[str, Any]], **extra: Any) -> Any:
    plugins: list[Mapping[str, Any]] = [
        {"type": "residency-filter", "name": "residency"},
        {"type": "health-filter", "name": "health"},
        {"type": "model-filter", "name": "model"},
        {"type": "ttft-scorer", "name": "ttft", "parameters": {"scale_ms": 40.0}},
        {"type": "load-scorer", "name": "load"},
        {"type": "tenant-affinity-scorer", "name": "home", "parameters": {"epsilon": 0.5}},
        picker,
    ]
    return {
        "name": "global-default",
        "plugins": plugins,
        "profile": {
            "filters": ["model", "residency", "health"],
            "scorers": scorers,
            "picker": picker["name"],
            **extra,
        },
    }


SPREAD = {
    "type": "headroom-spread-picker",
    "name": "spread",
    "parameters": {"saturation": 0.6, "spread_over": 4, "band": 0.1, "seed": 3},
}
MAX = {"type": "max-score-picker", "name": "max"}
SPECS: list[Mapping[str, Any]] = [
    profiles.DEFAULT_REQUEST_PROFILE,
    profiles.DEFAULT_DNS_PROFILE,
    _profile(
        SPREAD,
        [{"ref": "ttft", "weight": 1.0}, {"ref": "load", "weight": 0.3}, {"ref": "home"}],
        cost_model="ttft",
    ),
    _profile(MAX, [{"ref": "load", "weight": 2.0}, {"ref": "ttft", "weight": 0.5}]),
    _profile(MAX, [{"ref": "home", "weight": 1.0}], cost_model="ttft"),
    _profile(SPREAD, []),
]


def _routers(data: Mapping[str, Any]) -> tuple[GlobalRouter, GlobalRouter]:
    spec = load_profile_spec(dict(data))
    build = profiles.build(global_registry(), spec, None)
    fast = GlobalRouter(build, spec, cache_size=0)
    assert len(fast.fast_paths) == 2, fast.fast_paths  # every spec above takes both
    return fast, GlobalRouter(build, spec, cache_size=0, fast_path=False)


ROUTERS = [_routers(s) for s in SPECS]

points = st.one_of(
    st.none(),
    st.builds(
        GeoPoint,
        lat=st.floats(-80, 80, allow_nan=False),
        lon=st.floats(-179, 179, allow_nan=False),
    ),
)
loads = st.builds(
    lambda model, max_running, used, waiting, queued, prefill, gpus, healthy: ModelLoad(
        model=model,
        gpus=gpus,
        healthy_gpus=min(healthy, gpus),
        prefill_tokens_per_s=prefill,
        queued_prefill_tokens=queued,
        running_requests=min(used, max_running),
        waiting_requests=waiting,
        max_running_requests=max_running,
    ),
    model=st.sampled_from([MODEL, MODEL, OTHER_MODEL]),
    max_running=st.sampled_from([0, 10, 100]),
    used=st.integers(0, 100),
    waiting=st.sampled_from([0, 0, 5]),
    queued=st.integers(0, 300_000),
    prefill=st.sampled_from([0.0, 5_000.0, 20_000.0, 80_000.0]),
    gpus=st.integers(1, 8),
    healthy=st.integers(0, 8),
)
#: (region, model, prompt tokens, requests) charged to the in-flight ledger.
CHARGES = st.tuples(
    st.sampled_from(REGION_IDS),
    st.sampled_from([MODEL, OTHER_MODEL]),
    st.integers(0, 200_000),
    st.sampled_from([0.5, 1.0, 3.0]),
)
region_summaries = st.dictionaries(
    st.sampled_from(REGION_IDS),
    st.lists(loads, min_size=1, max_size=2, unique_by=lambda m: m.model),
)


def _same(fast: RouteOutcome, slow: RouteOutcome) -> None:
    assert fast.region == slow.region
    assert fast.fallbacks == slow.fallbacks
    assert fast.scores == slow.scores
    assert fast.predicted_ttft_ms == slow.predicted_ttft_ms
    assert fast.refusal == slow.refusal
    assert fast.detail == slow.detail
    assert fast.reasons == slow.reasons
    assert fast.trace == slow.trace


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(SPECS) - 1),
    tenant=st.sampled_from(TENANTS),
    country=st.sampled_from(COUNTRIES),
    point=points,
    client_point=points,
    model=st.sampled_from([MODEL, OTHER_MODEL, ANY_MODEL]),
    tokens=st.integers(0, 50_000),
    tokens2=st.integers(0, 50_000),
    down=st.sets(st.sampled_from(REGION_IDS)),
    drained=st.sets(st.sampled_from(REGION_IDS), max_size=2),
    found=region_summaries,
    measured=st.dictionaries(
        st.tuples(st.sampled_from(COUNTRIES[:-1]), st.sampled_from(REGION_IDS)),
        st.floats(1.0, 400.0),
        max_size=4,
    ),
    rid=st.text("abcdef0123456789", min_size=1, max_size=12),
    prefix=st.lists(st.integers(0, 2**63), max_size=2),
    charges=st.lists(CHARGES, max_size=6),
    more_charges=st.lists(CHARGES, max_size=3),
    same_gpus=st.booleans(),
)
def test_fast_path_decides_like_the_profile(
    which: int,
    tenant: str,
    country: str | None,
    point: GeoPoint | None,
    client_point: GeoPoint | None,
    model: str,
    tokens: int,
    tokens2: int,
    down: set[str],
    drained: set[str],
    found: dict[str, list[ModelLoad]],
    measured: dict[tuple[str, str], float],
    rid: str,
    prefix: list[int],
    charges: list[tuple[str, str, int, float]],
    more_charges: list[tuple[str, str, int, float]],
    same_gpus: bool,
) -> None:
    if same_gpus:  # one per-token prefill time everywhere (pipeline.Rows.uniform)
        same = {"gpus": 4, "healthy_gpus": 4, "prefill_tokens_per_s": 20_000.0}
        found = {r: [m.model_copy(update=same) for m in ms] for r, ms in found.items()}
    summaries: list[RegionSummary] = [summary(r, *ms) for r, ms in found.items()]
    v = view(
        summaries=summaries,
        down=down,
        drained=drained,
        latency=LatencyModel(measured) if measured else None,
    )
    # The in-flight ledger's overlay (what the front door and the simulator decide
    # over) is a view like any other: both paths must read its charged terms alike.
    ledger = InflightLedger(LedgerSettings(resolution_ms=0.0))
    for region, charged_model, charged_tokens, requests in charges:
        ledger.charge(region, charged_model, charged_tokens, now=2.0, requests=requests)
    base, v = v, ledger.view(v, now=2.0)
    request = RouteRequest(
        request_id=rid,
        model=model,
        input_tokens=tokens,
        tenant=tenant,
        client=ClientInfo(country=country, location=client_point),
        prefix_hashes=tuple(prefix),
    )
    location = Location(
        country, point, ipaddress.ip_network("192.0.2.0/24"), LocationSource.DATABASE
    )
    fast, slow = ROUTERS[which]
    _same(fast.decide(request, v, location), slow.decide(request, v, location))
    # Same view, client and model, another prompt size: the fast path reuses the
    # client's memoised rows (pipeline.GlobalChoice) and still decides the same.
    again = request.model_copy(update={"input_tokens": tokens2, "request_id": rid + "-2"})
    _same(fast.decide(again, v, location), slow.decide(again, v, location))
    # The DNS path (no residency lookup, no cache) agrees too.
    allowed = slow.verdict(request, v, country).allowed
    ctx = RequestContext(v, allowed, point, country)
    assert fast.choose_region(request, v, ctx) == slow.choose_region(request, v, ctx)
    # A later overlay of the same base: the fast path derives its per-view arrays from
    # the previous overlay's (batch.PerModel, pipeline.ChoiceMemo) and still decides the same.
    for region, charged_model, charged_tokens, requests in more_charges:
        ledger.charge(region, charged_model, charged_tokens, now=2.5, requests=requests)
    later = ledger.view(base, now=2.5)
    for each in (request, again):
        _same(fast.decide(each, later, location), slow.decide(each, later, location))


def test_every_built_in_and_example_profile_takes_the_fast_paths() -> None:
    policy = example_policy()
    for name, default in (
        (profiles.REQUEST_PROFILE_NAME, profiles.DEFAULT_REQUEST_PROFILE),
        (profiles.DNS_PROFILE_NAME, profiles.DEFAULT_DNS_PROFILE),
    ):
        for source in (None, policy):
            spec = profiles.profile_spec(source, name, default)
            router = GlobalRouter(profiles.build(global_registry(), spec, None), spec)
            assert len(router.fast_paths) == 2, (name, source, router.fast_paths)

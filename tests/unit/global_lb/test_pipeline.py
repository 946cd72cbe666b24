from __future__ import annotations

import ipaddress
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from global_lb import profiles
from global_lb.batch import PerModel
from global_lb.geo import Location, LocationSource
from global_lb.plugins import global_registry, ttft
from global_lb.router import GlobalRouter
from gtm.models import GeoPoint, RouteRequest
from gtm.routing import RoutingMetrics, load_profile_spec
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


def test_default_profiles_take_the_fast_paths_and_a_profile_without_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    metrics = RoutingMetrics(registry)
    default = profiles.build(global_registry(), spec_with(), metrics)
    assert default.fast_paths == ("global-filters", "global-spread-choice")
    plugins = [*profiles.DEFAULT_REQUEST_PROFILE["plugins"], {"type": "allow-list-filter",
               "name": "allow", "parameters": {"ids": ["eu-west"]}}]  # fmt: skip
    profile = dict(profiles.DEFAULT_REQUEST_PROFILE["profile"])
    profile["filters"] = [*profile["filters"], "allow"]
    with caplog.at_level(logging.INFO, logger="gtm.routing.runner"):
        allowing = profiles.build(
            global_registry(), spec_with(name="allowing", plugins=plugins, profile=profile), metrics
        )
    # The allow-list filter declares no mask: the filters run one by one, the choice
    # keeps its fast path; the log and the gauge say so.
    assert allowing.fast_paths == ("global-spread-choice",)
    assert "global profile 'allowing' runs its filters without a fast path" in caplog.text
    assert "filter 'allow' (AllowListFilter) lacks 'mask-filter'" in caplog.text

    def gauge(name: str, path: str) -> float | None:
        labels = {"tier": "global", "profile": name, "path": path}
        return registry.get_sample_value("gtm_routing_fast_path", labels)

    assert gauge("global-default", "global-filters") == 1.0
    assert gauge("global-default", "global-spread-choice") == 1.0
    assert gauge("global-default", "global-choice") == 0.0
    assert gauge("allowing", "global-filters") == 0.0
    assert gauge("allowing", "global-spread-choice") == 1.0
    fast, slow = routers(spec_with(name="allowing", plugins=plugins, profile=profile))
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=10, tenant="demo-global")
    a, b = fast.decide(request, view(), london()), slow.decide(request, view(), london())
    assert (a.region, a.fallbacks, a.scores, a.trace) == (b.region, b.fallbacks, b.scores, b.trace)


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


def test_overlay_columns_are_patched_from_the_previous_overlay() -> None:
    from global_lb.inflight import InflightLedger, LedgerSettings

    base = view(summaries=[summary(r, load(running=10 * i)) for i, r in enumerate(REGION_IDS)])
    ledger = InflightLedger(LedgerSettings(resolution_ms=0.0))
    fast, slow = routers(spec_with())
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=500, tenant="demo-global")
    first = ledger.view(base, now=2.0)
    fast.decide(request, first, london())
    scorer = fast.profile.scorers[0].scorer
    assert isinstance(scorer, ttft.TtftScorer)
    before = scorer._last
    assert before is not None
    assert before.view is first
    ledger.charge("eu-west", MODEL, 400_000, now=2.0, requests=40)
    second = ledger.view(base, now=2.0)
    assert second is not first
    a = fast.decide(request, second, london())
    after = scorer._last
    assert after is not None
    assert after.view is second
    # Only eu-west's terms changed: its entry is the one worked out again.
    assert after.parent is before
    assert after.changed == 1 << REGION_IDS.index("eu-west")
    fresh = PerModel(second, ttft.cost_terms, ttft._columns)
    assert after.get(MODEL) == fresh.get(MODEL) != before.get(MODEL)
    b = slow.decide(request, second, london())  # the reference shares the plugins
    assert (a.region, a.fallbacks, a.scores) == (b.region, b.fallbacks, b.scores)


def test_retry_targets_order_only_what_they_need() -> None:
    busy = [summary(r, load(running=5 * i)) for i, r in enumerate(REGION_IDS)]
    fast, _ = routers(spec_with())
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=10, tenant="demo-global")
    full = fast.decide(request, view(summaries=busy), london())
    assert len(full.fallbacks) == len(REGION_IDS) - 1
    for attempts in range(len(REGION_IDS) + 2):
        # A fresh decision each time: head() selects without the full order.
        outcome = fast.decide(request, view(summaries=busy), london())
        expected = (full.region, *full.fallbacks)[:attempts]
        assert outcome.targets(attempts) == expected
    assert full.ranking.best == full.scores[0][0]


def test_latency_rows_are_the_full_table_however_they_were_filled() -> None:
    from global_lb.view import LatencyModel

    v = view(latency=LatencyModel())
    point = GeoPoint(lat=35.7, lon=139.7)
    # Part of the row first (a residency-bound decision), then the rest (the full table).
    part = v.latency.row(v.signature, v.regions, point, "JP", (1, 4))
    full = v.rtts(point, "JP")
    assert part == (full[REGION_IDS[1]], full[REGION_IDS[4]])
    fresh = view(latency=LatencyModel())
    assert dict(fresh.rtts(point, "JP")) == dict(full)
    every = tuple(range(len(REGION_IDS)))
    assert v.latency.row(v.signature, v.regions, point, "JP", every) == tuple(full.values())

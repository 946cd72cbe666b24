"""Table-driven tests of the regional tier's zone-choice plugins."""

from __future__ import annotations

import math

import pytest

from gtm.models import RouteRequest
from gtm.routing import Removal
from regional_lb.plugins import health, kv_cache, load, model, prefix, residency, saturation, ttft
from regional_lb.view import ViewSettings, ZoneBatch, ZoneContext, ZoneState, zone_candidates
from tests.unit.regional_lb.helpers import MODEL, model_load, route_request, view, zone

REGIONAL = view(
    [
        zone("ok", model_load(queued=1_000, running=4, kv=(100, 60)), sketch=(1, 2)),
        zone("sick", model_load(healthy=0)),
        zone("down", healthy=False),
        zone("drained", drained=True),
        zone("other", model_load(model="other")),
        zone("full", model_load(running=16, waiting=20)),
        zone("dark", summary=False),
    ],
    settings=ViewSettings(),
)
CANDIDATES = zone_candidates(REGIONAL, MODEL)


def ctx(**fields: object) -> ZoneContext:
    return ZoneContext(REGIONAL, **fields)  # type: ignore[arg-type]


def ids(zones: tuple[ZoneState, ...]) -> list[str]:
    return [z.id for z in zones]


def batch(
    zones: tuple[ZoneState, ...] = CANDIDATES,
    context: ZoneContext | None = None,
    request: RouteRequest | None = None,
) -> ZoneBatch:
    return ZoneBatch(request or route_request(), zones, context or ctx())


def kept_and_reasons(removal: Removal | None) -> tuple[list[str], dict[str, str]]:
    """The candidates a filter keeps, and why it removes each other one."""
    if removal is None:
        return ids(CANDIDATES), {}
    removed = [int(k) for k in removal.mask.nonzero()[0]]
    kept = [z.id for k, z in enumerate(CANDIDATES) if k not in removed]
    return kept, {CANDIDATES[k].id: removal.reason(k) for k in removed}


@pytest.mark.parametrize(
    ("plugin", "context", "kept"),
    [
        (residency.ResidencyFilter(), ctx(allowed=frozenset({"r1"})), ids(CANDIDATES)),
        (residency.ResidencyFilter(), ctx(allowed=frozenset({"r2"})), []),
        (residency.ResidencyFilter(), ctx(), ids(CANDIDATES)),
        (health.HealthFilter(), ctx(), ["ok", "full"]),
        (
            health.HealthFilter(),
            ctx(panic=True),
            ["ok", "sick", "down", "other", "full", "dark"],
        ),
        (health.HealthFilter(), ctx(excluded=frozenset({"ok"})), ["full"]),
        (model.ModelFilter(), ctx(), ["ok", "sick", "down", "drained", "full"]),
        (saturation.SaturationFilter(), ctx(), ["ok", "down", "drained"]),
        (saturation.SaturationFilter(), ctx(panic=True), ["ok", "sick", "down", "drained"]),
    ],
)
def test_filters(plugin: object, context: ZoneContext, kept: list[str]) -> None:
    got, reasons = kept_and_reasons(plugin.removes(batch(context=context)))  # type: ignore[attr-defined]
    assert got == kept
    assert len(got) + len(reasons) == len(CANDIDATES)
    assert all(reasons.values())


def test_health_filter_says_why() -> None:
    _, reasons = kept_and_reasons(health.HealthFilter().removes(batch()))
    assert reasons["drained"] == "drained"
    assert "no zone summary" in reasons["dark"]
    assert "no healthy GPU" in reasons["sick"]


def test_ttft_scorer_is_the_cost_model() -> None:
    scorer = ttft.TtftScorer(params=ttft.Params(scale_ms=100.0))
    ok, sick = CANDIDATES[0], CANDIDATES[1]
    ok_cost, sick_cost = scorer.costs_ms(batch((ok, sick), request=route_request(tokens=1000)))
    assert ok_cost == pytest.approx(2.0 + 100.0 + 200.0)
    assert sick_cost == math.inf
    assert scorer.scores(batch((ok, sick))) == [1.0, 0.0]
    # Two hot leading blocks of 300 tokens each: 600 fewer tokens to prefill.
    hot = route_request(tokens=1000, prefix=(1, 2, 3))
    (cost,) = scorer.costs_ms(batch((ok,), ctx(tokens_per_block=300.0), hot))
    assert cost == pytest.approx(2.0 + 100.0 + 80.0)


def test_ttft_scores_are_relative_to_the_best_survivor() -> None:
    # The cheapest zone removed by a filter does not set the scale of the others.
    scorer = ttft.TtftScorer(params=ttft.Params(scale_ms=100.0))
    ok, full = CANDIDATES[0], CANDIDATES[5]
    both = batch((ok, full))
    both.alive[0] = False
    both.seal()
    assert scorer.scores(both) == [0.0, 1.0]


def test_prefix_affinity_scorer() -> None:
    scorer = prefix.PrefixAffinityScorer()
    ok, sick = CANDIDATES[0], CANDIDATES[1]
    hashes = route_request(prefix=(1, 2, 3, 4))
    assert scorer.scores(batch((ok, sick), request=hashes)) == [0.5, 0.0]
    assert scorer.scores(batch((ok,))) == [0.0]
    # Chained: the first block misses, so the hot second one does not count.
    assert scorer.scores(batch((ok,), request=route_request(prefix=(3, 1)))) == [0.0]


def test_load_and_kv_scorers() -> None:
    ok, full = CANDIDATES[0], CANDIDATES[5]
    assert load.LoadScorer().scores(batch((ok, full))) == [pytest.approx(0.75), 0.0]
    assert kv_cache.KvCacheScorer().scores(batch((ok, full))) == [0.6, 1.0]

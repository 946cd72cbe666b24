"""Table-driven tests of the regional tier's zone-choice plugins."""

from __future__ import annotations

import math

import pytest

from regional_lb.plugins import health, kv_cache, load, model, prefix, residency, saturation, ttft
from regional_lb.view import ViewSettings, ZoneContext, ZoneState, zone_candidates
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
    result = plugin.filter(route_request(), CANDIDATES, context)  # type: ignore[attr-defined]
    assert ids(result.kept) == kept
    assert len(result.kept) + len(result.removed) == len(CANDIDATES)
    assert all(reason for _, reason in result.removed)


def test_health_filter_says_why() -> None:
    result = health.HealthFilter().filter(route_request(), CANDIDATES, ctx())
    reasons = dict(result.removed)
    assert reasons["drained"] == "drained"
    assert "no zone summary" in reasons["dark"]
    assert "no healthy GPU" in reasons["sick"]


def test_ttft_scorer_is_the_cost_model() -> None:
    scorer = ttft.TtftScorer(params=ttft.Params(scale_ms=100.0))
    ok, sick = CANDIDATES[0], CANDIDATES[1]
    cost = scorer.cost_ms(route_request(tokens=1000), ok, ctx())
    assert cost == pytest.approx(2.0 + 100.0 + 200.0)
    assert scorer.cost_ms(route_request(), sick, ctx()) == math.inf
    scores = scorer.score(route_request(), (ok, sick), ctx())
    assert scores == {"ok": 1.0, "sick": 0.0}
    # Two hot leading blocks of 300 tokens each: 600 fewer tokens to prefill.
    hot = route_request(tokens=1000, prefix=(1, 2, 3))
    assert scorer.cost_ms(hot, ok, ctx(tokens_per_block=300.0)) == pytest.approx(2.0 + 100.0 + 80.0)


def test_prefix_affinity_scorer() -> None:
    scorer = prefix.PrefixAffinityScorer()
    ok, sick = CANDIDATES[0], CANDIDATES[1]
    assert scorer.score(route_request(prefix=(1, 2, 3, 4)), (ok, sick), ctx()) == {
        "ok": 0.5,
        "sick": 0.0,
    }
    assert scorer.score(route_request(), (ok,), ctx()) == {"ok": 0.0}
    # Chained: the first block misses, so the hot second one does not count.
    assert scorer.score(route_request(prefix=(3, 1)), (ok,), ctx()) == {"ok": 0.0}


def test_load_and_kv_scorers() -> None:
    ok, full = CANDIDATES[0], CANDIDATES[5]
    assert load.LoadScorer().score(route_request(), (ok, full), ctx()) == {
        "ok": pytest.approx(0.75),
        "full": 0.0,
    }
    assert kv_cache.KvCacheScorer().score(route_request(), (ok, full), ctx()) == {
        "ok": 0.6,
        "full": 1.0,
    }

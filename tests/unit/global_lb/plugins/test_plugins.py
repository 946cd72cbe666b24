"""Table-driven tests of each global-tier plugin, one class per module."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pytest

from global_lb.batch import Layout, MaskFilter, RegionBatch
from global_lb.plugins import (
    affinity,
    global_registry,
    health,
    load,
    model,
    residency,
    spread,
    ttft,
)
from global_lb.view import ANY_MODEL, GlobalView, RequestContext
from gtm.models import ClientInfo, GeoPoint, RouteRequest
from gtm.routing.framework import Floats
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, summary, view
from tests.unit.global_lb.helpers import load as load_of

LONDON = GeoPoint(lat=51.51, lon=-0.09)


def req(
    model_name: str = MODEL,
    tenant: str = "demo-global",
    rid: str = "r",
    tokens: int = 1000,
    point: GeoPoint | None = LONDON,
) -> RouteRequest:
    return RouteRequest(
        request_id=rid,
        model=model_name,
        input_tokens=tokens,
        tenant=tenant,
        client=ClientInfo(location=point),
    )


def ctx_for(v, allowed=frozenset(REGION_IDS), point: GeoPoint | None = LONDON) -> RequestContext:  # type: ignore[no-untyped-def]
    return RequestContext(v, frozenset(allowed), point, "GB", "rule-x")


def batch_for(  # type: ignore[no-untyped-def]
    v,
    request: RouteRequest | None = None,
    allowed=frozenset(REGION_IDS),
    point: GeoPoint | None = LONDON,
    alive: Iterable[str] | None = None,
) -> RegionBatch:
    """A batch over ``v`` whose survivors are ``alive`` (default: every region)."""
    layout = Layout.of(v, None)
    batch = RegionBatch.of(layout, request or req(point=point), ctx_for(v, allowed, point))
    if alive is not None:
        keep = set(alive)
        batch.alive = np.array([rid in keep for rid in layout.ids])
        batch.all_alive = len(keep) == len(layout.ids)
    batch.seal()
    return batch


def removed(plugin: MaskFilter, batch: RegionBatch) -> dict[str, str]:
    """What a filter removes from ``batch``, by id, with the reasons."""
    removal = plugin.removes(batch)
    if removal is None:
        return {}
    return {batch.ids[i]: removal.reason(i) for i in np.flatnonzero(removal.mask).tolist()}


def column(values: Sequence[float] | Floats, batch: RegionBatch) -> dict[str, float]:
    return {batch.ids[i]: float(values[i]) for i in batch.survivors.tolist()}


def pick(
    picker: spread.HeadroomSpreadPicker,
    v: GlobalView,
    request: RouteRequest,
    totals: dict[str, float],
) -> str:
    """The picker's choice among ``totals``' regions (the survivors) with those totals."""
    batch = batch_for(v, request, alive=totals)
    values = np.array([totals.get(rid, 0.0) for rid in batch.ids])
    return batch.ids[picker.pick(batch, values)]


def test_registry_has_every_global_type_and_the_builtins() -> None:
    names = set(global_registry().type_names())
    assert {
        "residency-filter", "health-filter", "model-filter", "ttft-scorer", "ttft-cost-model",
        "load-scorer", "tenant-affinity-scorer", "headroom-spread-picker", "max-score-picker",
    } <= names  # fmt: skip


def test_residency_filter_keeps_only_allowed_and_names_the_rule() -> None:
    v = view()
    gone = removed(residency.ResidencyFilter(), batch_for(v, allowed={"eu-west"}))
    assert set(gone) == set(REGION_IDS) - {"eu-west"}
    assert all("rule-x" in why for why in gone.values())


def test_residency_filter_with_an_empty_set_removes_everything() -> None:
    v = view()
    assert set(removed(residency.ResidencyFilter(), batch_for(v, allowed=set()))) == set(REGION_IDS)


@pytest.mark.parametrize(
    ("down", "drained", "removed"),
    [
        ((), (), {}),
        (("eu-west",), (), {"eu-west": "unhealthy"}),
        ((), ("us-east",), {"us-east": "drained"}),
    ],
)
def test_health_filter(
    down: tuple[str, ...], drained: tuple[str, ...], removed: dict[str, str]
) -> None:
    v = view(down=down, drained=drained)
    gone = globals()["removed"](health.HealthFilter(), batch_for(v))
    assert {cid: why.split(":")[0] for cid, why in gone.items()} == removed


def test_model_filter() -> None:
    v = view(
        summaries=[
            summary("eu-west", load_of(model="other")),
            summary("us-east", load_of(healthy_gpus=0)),
        ]
    )
    gone = removed(model.ModelFilter(), batch_for(v))
    assert set(gone) == {"eu-west", "us-east"}
    assert all("does not serve model" in why for why in gone.values())
    # Regions without a summary are kept; DNS (any model) keeps everything.
    assert removed(model.ModelFilter(), batch_for(v, req(ANY_MODEL))) == {}


def test_ttft_cost_is_rtt_plus_queue_plus_own_prefill() -> None:
    v = view(summaries=[summary("eu-west", load_of(queued=20_000, prefill=20_000, gpus=4))])
    ctx = ctx_for(v)
    at = REGION_IDS.index
    costs = ttft.TtftScorer().costs_ms(batch_for(v, req(tokens=1000)))
    # 20k queued tokens at 20k tok/s = 1 s; 1000 own tokens on one of 4 GPUs = 200 ms.
    assert costs[at("eu-west")] == pytest.approx(ctx.rtt_ms(v.by_id["eu-west"]) + 1200.0)
    # Without a summary only the RTT counts; a model missing from the summary is ∞.
    assert costs[at("us-east")] == pytest.approx(ctx.rtt_ms(v.by_id["us-east"]))
    other = ttft.TtftScorer().costs_ms(batch_for(v, req("other")))
    assert math.isinf(other[at("eu-west")])


def test_ttft_scores_are_in_unit_interval_best_is_one() -> None:
    v = view()
    batch = batch_for(v)
    scores = column(ttft.TtftScorer().scores(batch), batch)
    assert max(scores.values()) == 1.0
    assert scores["eu-west"] == 1.0
    assert all(0.0 <= s <= 1.0 for s in scores.values())
    assert scores["eu-central"] > scores["us-east"] > scores["ap-southeast"]


def test_measured_latency_overrides_the_distance_model() -> None:
    from global_lb.view import LatencyModel

    v = view(latency=LatencyModel({("GB", "us-east"): 1.0}))
    assert ctx_for(v).rtt_ms(v.by_id["us-east"]) == 1.0
    assert ctx_for(v, point=None).rtt_ms(v.by_id["eu-west"]) == pytest.approx(26.0)


def test_load_scorer_is_headroom() -> None:
    v = view(summaries=[summary("eu-west", load_of(running=60, waiting=15, max_running=100))])
    batch = batch_for(v)
    scores = column(load.LoadScorer().scores(batch), batch)
    assert scores["eu-west"] == pytest.approx(0.25)
    assert scores["us-east"] == 1.0  # no summary: unknown load counts as idle


def test_affinity_is_stable_and_moves_only_when_the_home_is_full() -> None:
    scorer = affinity.TenantAffinityScorer()
    v = view(summaries=[summary(r, load_of(running=10)) for r in REGION_IDS])
    homes = {t: scorer.home(req(tenant=t), v.regions) for t in ("t1", "t2", "t3", "t4", "t5")}
    assert homes == {t: scorer.home(req(tenant=t), v.regions) for t in homes}
    assert len(set(homes.values())) > 1  # tenants spread over regions
    home = homes["t1"]
    full = view(
        summaries=[summary(r, load_of(running=95 if r == home else 10)) for r in REGION_IDS]
    )
    assert scorer.home(req(tenant="t1"), full.regions) != home
    batch = batch_for(v, req(tenant="t1"))
    scores = column(scorer.scores(batch), batch)
    assert sorted(scores.values()) == [0.0] * 5 + [1.0]
    assert home is not None
    assert scores[home] == 1.0


def test_spread_picker_takes_the_best_with_headroom() -> None:
    v = view(summaries=[summary(r, load_of(running=10)) for r in REGION_IDS])
    picker = spread.HeadroomSpreadPicker()
    assert pick(picker, v, req(), {"eu-west": 1.0, "eu-central": 0.9}) == "eu-west"


def test_spread_picker_spreads_a_saturated_best_by_headroom() -> None:
    loads = {"eu-west": 95, "eu-central": 40, "us-east": 80}
    v = view(summaries=[summary(r, load_of(running=loads.get(r, 0))) for r in REGION_IDS])
    picker = spread.HeadroomSpreadPicker()
    totals = {"eu-west": 1.0, "eu-central": 0.9, "us-east": 0.6, "ap-northeast": 0.1}
    picks = Counter(pick(picker, v, req(rid=str(i)), totals) for i in range(2000))
    # Headroom 0.05 : 0.60 : 0.20 over the 3 best; ap-northeast is outside the band.
    assert set(picks) == {"eu-west", "eu-central", "us-east"}
    assert picks["eu-central"] / 2000 == pytest.approx(0.60 / 0.85, abs=0.05)
    assert picks["us-east"] / 2000 == pytest.approx(0.20 / 0.85, abs=0.05)


def test_spread_picker_spreads_displaced_clients() -> None:
    v = view(down=["eu-west"])
    survivors = {"eu-central": 1.0, "us-east": 0.7, "us-west": 0.5}
    picker = spread.HeadroomSpreadPicker()
    picks = Counter(pick(picker, v, req(rid=str(i)), survivors) for i in range(600))
    assert len(picks) == 3  # not all of eu-west's clients land on eu-central
    far = req(point=GeoPoint(lat=35.0, lon=139.0))  # Tokyo: not displaced by eu-west
    assert pick(picker, v, far, survivors) == "eu-central"


def test_spread_picker_is_deterministic_per_request() -> None:
    v = view(summaries=[summary(r, load_of(running=90)) for r in REGION_IDS])
    totals = {"eu-west": 1.0, "eu-central": 0.9, "us-east": 0.8}
    picker = spread.HeadroomSpreadPicker(params=spread.Params(seed=7))
    first = [pick(picker, v, req(rid=str(i)), totals) for i in range(50)]
    assert first == [pick(picker, v, req(rid=str(i)), totals) for i in range(50)]


def test_spread_picker_without_headroom_returns_the_best() -> None:
    v = view(summaries=[summary(r, load_of(running=100)) for r in REGION_IDS])
    picker = spread.HeadroomSpreadPicker()
    assert pick(picker, v, req(), {"us-east": 0.9, "eu-west": 1.0}) == "eu-west"


def test_spread_params_are_validated() -> None:
    with pytest.raises(ValueError, match="saturation"):
        spread.Params(saturation=1.5)


def test_fast_rtt_table_matches_the_distance_model() -> None:
    from gtm.routing.cost import rtt_ms_from_distance

    v = view()
    for point in (LONDON, GeoPoint(lat=-33.9, lon=151.2), GeoPoint(lat=47.6, lon=-122.3)):
        table = v.rtts(point, "GB")
        for region in v.regions:
            expected = rtt_ms_from_distance(point.distance_km(region.location))
            assert table[region.id] == pytest.approx(expected, rel=1e-9)

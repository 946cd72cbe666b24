"""global_lb.plugins.ttft: every form of the global TTFT cost and TTFT + load total gives
the same bits — the scalar reference (what ``ttft-scorer`` runs, then the profile's
weighted total), the column forms the fast path runs, and the compiled kernel
(global_lb.plugins._ttft) as well as its Python twin. Any edit to one form alone fails
here."""

from __future__ import annotations

import math
from types import MappingProxyType
from unittest import mock

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from global_lb.batch import Layout, RegionBatch
from global_lb.plugins import _ttft, ttft
from global_lb.view import GlobalView, ModelTerms, RegionState, RequestContext
from gtm import native
from gtm.models import GeoPoint, RouteRequest
from gtm.routing.cost import scores_from_costs
from gtm.testing.kernels import expected_state, python_twin
from tests.unit.global_lb.helpers import MODEL, summary, view

TWIN = python_twin("global_lb.plugins._ttft")
SUMMARY = summary("somewhere")
HERE = GeoPoint(lat=0.0, lon=0.0)

#: One region: no summary (cost = RTT), no terms for the model (∞), or terms.
regions = st.one_of(
    st.just(("none", 0.0, 0.0, 1.0)),
    st.just(("missing", 0.0, 0.0, 0.0)),
    st.tuples(
        st.just("terms"),
        st.floats(0.0, 1e5) | st.just(math.inf),
        st.sampled_from([0.0, 0.05, 0.125, 0.3]) | st.floats(0.0, 10.0),
        st.floats(0.0, 1.0),
    ),
)


def region(i: int, kind: str, queue_ms: float, ms_per_token: float, headroom: float) -> RegionState:
    if kind == "none":
        return RegionState(f"r{i:02d}", HERE, "GB", "")
    terms = {} if kind == "missing" else {MODEL: ModelTerms(queue_ms, ms_per_token, headroom, True)}
    return RegionState(f"r{i:02d}", HERE, "GB", "", summary=SUMMARY, terms=MappingProxyType(terms))


def bits(values: object) -> list[str]:
    return [float(v).hex() for v in values]  # type: ignore[attr-defined]


def reference_totals(
    costs: list[float], headroom: list[float], w_ttft: float, w_load: float, scale: float
) -> tuple[list[float], float]:
    """What the generic profile does: the scorer's scores, then ``Σ wᵢ·sᵢ / Σ wᵢ`` summed
    in profile order (gtm.routing.runner)."""
    ids = [f"r{i:02d}" for i in range(len(costs))]
    scores = list(scores_from_costs(dict(zip(ids, costs, strict=True)), scale).values())
    weight_sum = 0.0 + w_ttft + w_load
    totals = [0.0] * len(costs)
    for w, column in ((w_ttft, scores), (w_load, headroom)):
        totals = [t + w * s for t, s in zip(totals, column, strict=True)]
    return [t / weight_sum for t in totals], weight_sum


def test_the_kernel_runs_compiled() -> None:
    assert native.kernel("global_lb.plugins._ttft").state is expected_state()
    assert TWIN.__file__ is not None
    assert TWIN.__file__.endswith("_ttft.py")


@given(
    drawn=st.lists(regions, min_size=1, max_size=40),
    data=st.data(),
    tokens=st.integers(0, 200_000),
    weights=st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 10.0)).filter(lambda w: sum(w) > 0),
    scale=st.floats(1.0, 1e4),
    uniform=st.booleans(),
)
def test_every_form_gives_the_same_bits(
    drawn: list[tuple[str, float, float, float]],
    data: st.DataObject,
    tokens: int,
    weights: tuple[float, float],
    scale: float,
    uniform: bool,
) -> None:
    if uniform:  # one GPU type everywhere: every region's per-token time is the same
        drawn = [(kind, q, drawn[0][2] if kind == "terms" else p, h) for kind, q, p, h in drawn]
        drawn = [d for d in drawn if d[0] == "terms"] or [("terms", 1.0, 0.1, 0.5)]
    places = [region(i, *d) for i, d in enumerate(drawn)]
    n = len(places)
    rtts = data.draw(st.lists(st.floats(0.0, 500.0), min_size=n, max_size=n))
    headroom = [r.headroom(MODEL) for r in places]
    terms = [ttft.cost_terms(r, MODEL) for r in places]

    # The scalar reference, region by region.
    costs = [ttft.cost_ms(rtt, b, p, tokens) for rtt, (b, p) in zip(rtts, terms, strict=True)]
    expected, weight_sum = reference_totals(costs, headroom, *weights, scale)

    # The column forms.
    fixed = ttft.fixed_column(rtts, [b for b, _ in terms])
    per_token = tuple(p for _, p in terms)
    assert bits(ttft.costs_column(fixed, per_token, tokens)) == bits(costs)
    ids = [r.id for r in places]
    scores = scores_from_costs(dict(zip(ids, costs, strict=True)), scale)
    assert bits(ttft.scores_column(ids, costs, scale)) == bits(scores.values())

    # The fused total, compiled and as Python; with the shared per-token time when there is one.
    same = per_token[0] if per_token.count(per_token[0]) == n else None
    for kernel in (_ttft, TWIN):
        with mock.patch.object(ttft, "_ttft", kernel):
            totals, fused_costs, top = ttft.fused_totals(
                fixed, per_token, same, ttft.lowest(fixed), tuple(headroom), tokens,
                (*weights, weight_sum), scale,
            )  # fmt: skip
        assert bits(totals) == bits(expected)
        assert bits(fused_costs) == bits(costs)
        assert top == expected.index(max(expected))
        if same is not None:
            assert isinstance(fused_costs, ttft.ShiftedCosts)
            assert [ttft.with_prompt(fused_costs.fixed(k), same, tokens) for k in range(n)] == [
                fused_costs[k] for k in range(n)
            ]


def test_the_scorer_and_the_cost_model_agree_with_the_scalar_form() -> None:
    v: GlobalView = view()
    ctx = RequestContext(v, frozenset(r.id for r in v.regions), HERE, "GB", "")
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=1234, tenant="demo-global")
    scorer = ttft.TtftScorer(params=ttft.Params(scale_ms=40.0))
    batch = RegionBatch.of(Layout.of(v, None), request, ctx)
    batch.alive = np.arange(len(v.regions)) > 0  # scores are relative to the survivors' best
    batch.seal()
    rtts = ctx.rtts()
    costs = {
        r.id: ttft.cost_ms(rtts[r.id], *ttft.cost_terms(r, MODEL), request.input_tokens)
        for r in v.regions
    }
    survivors = batch.survivors.tolist()
    expected = scores_from_costs({v.regions[i].id: costs[v.regions[i].id] for i in survivors}, 40.0)
    scores = scorer.scores(batch)
    assert {v.regions[i].id: float(scores[i]) for i in survivors} == expected
    priced = scorer.costs_ms(batch)
    for i, r in enumerate(v.regions):
        assert (
            priced[i]
            == costs[r.id]
            == ttft.cost_ms(ctx.rtt_ms(r), *ttft.cost_terms(r, MODEL), request.input_tokens)
        )

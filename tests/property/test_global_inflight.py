"""Property: whatever the sequence of charges, cancels, newer summaries and expiries,
the in-flight ledger's overlay shows exactly the summaries plus what is still unseen
(its incremental rebuild never leaves a region's terms stale)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from global_lb.inflight import Charge, InflightLedger, LedgerSettings
from global_lb.view import GlobalView, model_terms
from tests.unit.global_lb.helpers import MODEL, REGION_IDS, load, summary, view

OTHER = "other/model"


def _view(published_at: float, revision: int) -> GlobalView:
    summaries = [
        summary(r, load(running=10, queued=1_000), load(model=OTHER)).model_copy(
            update={"published_at": published_at}
        )
        for r in REGION_IDS[:4]  # two regions without a summary
    ]
    return view(summaries=summaries, revision=revision)


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("charge"),
            st.sampled_from(REGION_IDS),
            st.sampled_from([MODEL, OTHER]),
            st.integers(0, 50_000),
        ),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("summary"), st.floats(0.0, 3.0)),
        st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=operations, resolution=st.sampled_from([0.0, 2.0, 50.0]))
def test_the_overlay_is_the_summaries_plus_what_is_unseen(
    ops: list[tuple[object, ...]], resolution: float
) -> None:
    ledger = InflightLedger(LedgerSettings(expire_s=2.0, resolution_ms=resolution))
    now, published, revision = 10.0, 10.0, 1
    base = _view(published, revision)
    charges: list[Charge] = []
    for op in ops:
        kind = op[0]
        if kind == "charge":
            _, region, model, tokens = op
            charges.append(ledger.charge(str(region), str(model), int(tokens), now))  # type: ignore[call-overload]
        elif kind == "cancel" and charges:
            ledger.cancel(charges[int(op[1]) % len(charges)])  # type: ignore[call-overload]
        elif kind == "summary":
            published = now - float(op[1])  # type: ignore[arg-type]
            revision += 1
            base = _view(published, revision)
        elif kind == "tick":
            now += float(op[1])  # type: ignore[arg-type]
        overlay = ledger.view(base, now)
        if resolution > 0.0:
            continue  # a coarse ledger may lag by up to its resolution
        for region in overlay.regions:
            for model, terms in region.terms.items():
                if region.summary is None:
                    assert region is base.by_id[region.id]
                    continue
                unseen = ledger.unseen(region.id, model)
                expected = model_terms(region.loads[model], unseen.requests, unseen.tokens)
                assert terms == expected
    # Its totals are exactly its live charges (float sums, so up to rounding).
    live = [c for c in charges if c.live]
    for region in REGION_IDS:
        want = sum(c.tokens for c in live if c.region == region)
        assert abs(ledger.unseen(region, "gtm:any-model").tokens - want) < 1e-6

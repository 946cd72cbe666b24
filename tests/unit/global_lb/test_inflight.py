"""The global tier's in-flight ledger: charge, reconcile on a newer summary, expiry,
cancel, the overlay's terms and its resolution, and the herd it prevents."""

from __future__ import annotations

import pytest

from global_lb import profiles
from global_lb.inflight import InflightLedger, LedgerSettings, Unseen
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from global_lb.view import ANY_MODEL, GlobalView, model_terms
from gtm.models import ClientInfo, GeoPoint, RegionSummary, RouteRequest
from tests.unit.global_lb.helpers import MODEL, load, summary, view

OTHER = "other/model"
FRANKFURT = GeoPoint(lat=50.11, lon=8.68)


def _summary(region: str, published_at: float, **kwargs: float) -> RegionSummary:
    loads = (load(**kwargs), load(model=OTHER, **kwargs))  # type: ignore[arg-type]
    return summary(region, *loads).model_copy(update={"published_at": published_at})


def _view(published_at: float = 1.0, revision: int = 1, **kwargs: float) -> GlobalView:
    return view(
        summaries=[_summary(r, published_at, **kwargs) for r in ("eu-central", "eu-west")],
        revision=revision,
    )


def test_a_charge_is_unseen_per_model_and_in_the_sum_over_models() -> None:
    ledger = InflightLedger()
    ledger.charge("eu-west", MODEL, 1_000, now=2.0)
    ledger.charge("eu-west", MODEL, 500, now=2.1)
    ledger.charge("eu-west", OTHER, 200, now=2.2)
    assert ledger.unseen("eu-west", MODEL) == Unseen(2.0, 1_500.0)
    assert ledger.unseen("eu-west", OTHER) == Unseen(1.0, 200.0)
    assert ledger.unseen("eu-west", ANY_MODEL) == Unseen(3.0, 1_700.0)
    assert ledger.unseen("eu-central", MODEL) == Unseen()


def test_the_overlay_counts_unseen_requests_as_waiting_and_tokens_as_queued() -> None:
    base = _view(running=40, max_running=100, queued=10_000, prefill=20_000.0)
    ledger = InflightLedger(LedgerSettings(resolution_ms=0.0))
    ledger.view(base, now=1.5)
    ledger.charge("eu-west", MODEL, 4_000, now=2.0)
    ledger.charge("eu-west", MODEL, 6_000, now=2.0)
    overlay = ledger.view(base, now=2.0)
    west = overlay.by_id["eu-west"]
    summary_load = west.loads[MODEL]
    assert west.terms[MODEL] == model_terms(summary_load, 2, 10_000)
    assert west.terms[MODEL].queue_ms == pytest.approx(1000.0 * 20_000 / 20_000.0)
    assert west.headroom(MODEL) == pytest.approx(1.0 - 42 / 100)
    # The aggregate DNS reads carries the charges too; the other model does not.
    assert west.terms[ANY_MODEL] == model_terms(west.loads[ANY_MODEL], 2, 10_000)
    assert west.terms[OTHER] == base.by_id["eu-west"].terms[OTHER]
    # Uncharged regions are the base's own objects; the base is untouched.
    assert overlay.by_id["eu-central"] is base.by_id["eu-central"]
    assert base.by_id["eu-west"].headroom(MODEL) == pytest.approx(0.6)
    # A new revision (caches keyed on it start afresh), the same sources.
    assert overlay.revision != base.revision
    assert overlay.revision.ledger > 0
    assert (overlay.revision.snapshot, overlay.revision.health) == (1, 1)


def test_nothing_charged_is_the_base_view_itself() -> None:
    base = _view()
    assert InflightLedger().view(base, now=1.0) is base


def test_a_newer_summary_reconciles_what_it_accounts_for_and_keeps_the_rest() -> None:
    ledger = InflightLedger()
    first = _view(published_at=1.0)
    ledger.view(first, now=1.0)
    ledger.charge("eu-west", MODEL, 1_000, now=1.4)
    ledger.charge("eu-west", MODEL, 2_000, now=2.5)
    # The same summary again (another view revision, e.g. a health change): nothing new.
    ledger.view(_view(published_at=1.0, revision=2), now=2.6)
    assert ledger.unseen("eu-west", MODEL) == Unseen(2.0, 3_000.0)
    # A summary published at 2.0 includes the 1.4 charge, not the 2.5 one.
    overlay = ledger.view(_view(published_at=2.0, revision=3), now=2.7)
    assert ledger.unseen("eu-west", MODEL) == Unseen(1.0, 2_000.0)
    assert overlay.by_id["eu-west"].terms[MODEL] == model_terms(load(), 1, 2_000)
    # Published at 3.0: everything is in it; the overlay is the base again.
    latest = _view(published_at=3.0, revision=4)
    assert ledger.view(latest, now=3.1) is latest
    assert ledger.unseen("eu-west", ANY_MODEL) == Unseen()


def test_charges_expire_without_a_newer_summary() -> None:
    ledger = InflightLedger(LedgerSettings(expire_s=5.0, resolution_ms=0.0))
    base = _view(published_at=1.0)
    ledger.view(base, now=1.0)
    ledger.charge("eu-west", MODEL, 1_000, now=2.0)
    ledger.charge("eu-west", MODEL, 1_000, now=4.0)
    assert ledger.view(base, now=6.9).by_id["eu-west"].terms[MODEL] == model_terms(load(), 2, 2_000)
    # 7.5: the first charge is older than 5 s, the second is not.
    overlay = ledger.view(base, now=7.5)
    assert ledger.unseen("eu-west", MODEL) == Unseen(1.0, 1_000.0)
    assert overlay.by_id["eu-west"].terms[MODEL] == model_terms(load(), 1, 1_000)
    assert ledger.view(base, now=9.5) is base


def test_a_cancelled_charge_is_taken_back_once() -> None:
    ledger = InflightLedger(LedgerSettings(resolution_ms=0.0))
    base = _view()
    ledger.view(base, now=1.0)
    kept = ledger.charge("eu-west", MODEL, 1_000, now=2.0)
    failed = ledger.charge("eu-west", MODEL, 3_000, now=2.0)
    ledger.cancel(failed)
    ledger.cancel(failed)
    assert kept.live
    assert not failed.live
    assert ledger.unseen("eu-west", MODEL) == Unseen(1.0, 1_000.0)
    assert ledger.view(base, now=2.0).by_id["eu-west"].terms[MODEL] == model_terms(load(), 1, 1_000)


def test_the_overlay_is_rebuilt_only_past_the_resolution() -> None:
    # Two models × 20,000 prompt tokens/s: 2 ms of queueing is 80 tokens.
    ledger = InflightLedger(LedgerSettings(resolution_ms=2.0, resolution_headroom=0.05))
    base = _view(prefill=20_000.0, max_running=100)
    assert ledger.view(base, now=1.0) is base
    ledger.charge("eu-west", MODEL, 50, now=1.1)  # 1.25 ms: not yet
    assert ledger.view(base, now=1.1) is base
    ledger.charge("eu-west", MODEL, 50, now=1.2)  # 2.5 ms since the last overlay
    first = ledger.view(base, now=1.2)
    assert first.by_id["eu-west"].terms[MODEL] == model_terms(load(), 2, 100)
    ledger.charge("eu-west", MODEL, 50, now=1.3)
    assert ledger.view(base, now=1.3) is first
    ledger.charge("eu-west", MODEL, 40, now=1.4)  # 90 tokens since ``first``: 2.25 ms
    second = ledger.view(base, now=1.4)
    assert second is not first
    assert second.by_id["eu-west"].terms[MODEL] == model_terms(load(), 4, 190)
    # 5 % of 200 slots: ten requests of no prompt move the headroom enough.
    for n in range(10):
        ledger.charge("eu-central", MODEL, 0, now=1.5)
        assert (ledger.view(base, now=1.5) is second) == (n < 9)


def test_each_region_enters_the_overlay_at_its_own_resolution() -> None:
    # 2 ms of queueing is 80 tokens (see above). A region's charges below that stay out
    # of the overlay even when another region's reach it: an overlay then changes only
    # the regions that moved, and the router's memos for the others carry over.
    ledger = InflightLedger(LedgerSettings(resolution_ms=2.0, resolution_headroom=0.05))
    base = _view(prefill=20_000.0, max_running=100)
    ledger.view(base, now=1.0)
    ledger.charge("eu-central", MODEL, 50, now=1.1)  # 1.25 ms: not yet
    ledger.charge("eu-west", MODEL, 100, now=1.1)  # 2.5 ms
    first = ledger.view(base, now=1.1)
    assert first.by_id["eu-west"].terms[MODEL] == model_terms(load(), 1, 100)
    assert first.by_id["eu-central"] is base.by_id["eu-central"]
    ledger.charge("eu-central", MODEL, 40, now=1.2)  # 90 tokens unshown: 2.25 ms
    second = ledger.view(base, now=1.2)
    assert second.by_id["eu-central"].terms[MODEL] == model_terms(load(), 2, 90)
    assert second.by_id["eu-west"] is first.by_id["eu-west"]
    # A cancel is shown at once, whatever its size.
    cancelled = ledger.charge("eu-west", MODEL, 1, now=1.3)
    assert ledger.view(base, now=1.3) is second
    ledger.cancel(cancelled)
    third = ledger.view(base, now=1.3)
    assert third.by_id["eu-west"].terms[MODEL] == model_terms(load(), 1, 100)
    assert third.by_id["eu-central"] is second.by_id["eu-central"]


def test_a_region_without_a_summary_is_left_as_it_is() -> None:
    base = view(summaries=[_summary("eu-central", 1.0)])
    ledger = InflightLedger(LedgerSettings(resolution_ms=0.0))
    ledger.view(base, now=1.0)
    ledger.charge("eu-west", MODEL, 50_000, now=1.1)
    overlay = ledger.view(base, now=1.1)
    assert overlay.by_id["eu-west"] is base.by_id["eu-west"]
    assert overlay.by_id["eu-west"].headroom(MODEL) == 1.0


def test_a_disabled_ledger_charges_nothing() -> None:
    ledger = InflightLedger(LedgerSettings(enabled=False))
    base = _view()
    charge = ledger.charge("eu-west", MODEL, 50_000, now=1.0)
    assert not charge.live
    assert ledger.unseen("eu-west", MODEL) == Unseen()
    assert ledger.view(base, now=1.0) is base


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="expire_s"):
        LedgerSettings(expire_s=0.0)
    with pytest.raises(ValueError, match="resolutions"):
        LedgerSettings(resolution_ms=-1.0)


def _router() -> GlobalRouter:
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    return GlobalRouter(profiles.build(global_registry(), spec, None), spec)


def _request(n: int) -> RouteRequest:
    return RouteRequest(
        request_id=f"r{n}",
        model=MODEL,
        input_tokens=8_000,
        tenant="demo-global",
        client=ClientInfo(country="DE", location=FRANKFURT),
    )


def test_decisions_see_their_own_recent_choices_instead_of_herding() -> None:
    """One summary interval of requests from Frankfurt: without the ledger every one goes
    to the region that looked best; with it, they move on once it has had its share."""
    base = _view(published_at=1.0, prefill=40_000.0, max_running=200)
    router = _router()
    blind = {router.decide(_request(n), base).region for n in range(40)}
    assert blind == {"eu-central"}
    ledger = InflightLedger()
    chosen = []
    for n in range(40):
        outcome = router.decide(_request(n), ledger.view(base, now=1.0 + n / 100))
        assert outcome.region is not None
        ledger.charge(outcome.region, MODEL, 8_000, now=1.0 + n / 100)
        chosen.append(outcome.region)
    assert chosen[0] == "eu-central"
    assert "eu-west" in chosen
    # The next summary accounts for all of it: the nearest region wins again.
    fresh = _view(published_at=2.0, revision=2, prefill=40_000.0, max_running=200)
    assert router.decide(_request(99), ledger.view(fresh, now=2.1)).region == "eu-central"

from __future__ import annotations

import pytest

from policies.documents import SaturationPolicy
from regional_lb.priority import SplitMode
from regional_lb.profiles import build, profile_spec
from regional_lb.router import (
    Inputs,
    PanicMode,
    Reason,
    RegionalDecision,
    RegionalRouter,
    Route,
    RouterSettings,
)
from regional_lb.spill import SpillLimiter, SpillSettings
from regional_lb.view import RegionalView, ViewSettings, ZoneAccounting
from tests.unit.regional_lb.helpers import NOW, model_load, peer, route_request, view, zone

ALL = frozenset({"r1", "r2", "r3"})
SPILL = SaturationPolicy.SPILL_WITHIN_ALLOWED
FULL = model_load(running=16, waiting=40)  # past 16 running + 5 waiting per GPU


def router(**settings: object) -> RegionalRouter:
    return RegionalRouter(
        build(profile_spec(None)),
        saturation_filter="saturation",
        settings=RouterSettings(**settings),  # type: ignore[arg-type]
    )


def inputs(
    allowed: frozenset[str] = ALL,
    *,
    on_saturation: SaturationPolicy = SPILL,
    known: bool = True,
    hops: int = 0,
    spilled_from: tuple[str, ...] = (),
) -> Inputs:
    return Inputs(
        allowed=allowed,
        on_saturation=on_saturation,
        hops=hops,
        spilled_from=spilled_from,
        client_country_known=known,
    )


def decide(
    regional: RegionalView,
    given: Inputs | None = None,
    *,
    using: RegionalRouter | None = None,
    request_id: str = "req-1",
    accounting: ZoneAccounting | None = None,
) -> RegionalDecision:
    return (using or router()).decide(
        route_request(request_id),
        regional,
        given or inputs(),
        accounting=accounting,
        now=NOW,
        now_wall=NOW,
    )


def test_the_zone_with_the_shortest_predicted_ttft_wins() -> None:
    regional = view([zone("a", model_load(queued=50_000)), zone("b", model_load(queued=1_000))])
    decision = decide(regional)
    assert decision.route is Route.LOCAL
    assert decision.zone is not None
    assert decision.zone.id == "b"
    assert decision.decision is not None
    # 2 ms RTT + 1000 queued / 10k tok/s + 1000 own tokens on one of 2 GPUs (5k tok/s).
    assert decision.decision.predicted_ttft_ms == pytest.approx(2.0 + 100.0 + 200.0)


def test_prefix_locality_lowers_the_cost() -> None:
    hot = (11, 12)
    regional = view(
        [zone("a", model_load(queued=500)), zone("b", model_load(queued=600), sketch=hot)]
    )
    request = route_request(tokens=1000, prefix=hot)
    choice = router().decide(
        request,
        regional,
        Inputs(ALL, SPILL, tokens_per_block=400.0),
        accounting=None,
        now=NOW,
        now_wall=NOW,
    )
    assert choice.zone is not None
    assert choice.zone.id == "b"  # 800 of its 1000 tokens are hot there


def test_local_accounting_makes_a_zone_full_before_its_summary_says_so() -> None:
    regional = view(
        [zone("a", model_load(gpus=1, max_running=2))], settings=ViewSettings(queue_depth_per_gpu=0)
    )
    accounting = ZoneAccounting()
    accounting.observe(regional.zones)
    assert decide(regional, accounting=accounting).route is Route.LOCAL
    accounting.start("a", "m", 100)
    accounting.start("a", "m", 100)
    assert decide(regional, accounting=accounting).route is Route.QUEUE


def test_a_full_region_spills_to_the_cheapest_allowed_peer() -> None:
    regional = view(
        [zone("a", FULL)],
        [peer("r2", rtt=20.0), peer("r3", rtt=100.0), peer("r4", rtt=1.0)],
    )
    decision = decide(regional)
    assert decision.route is Route.SPILL
    assert decision.reason is Reason.SATURATED
    assert decision.peer is not None
    assert decision.peer.region == "r2"  # r4 is nearer but not allowed
    assert [o.region for o in decision.fallbacks] == ["r3"]
    assert decision.trace is not None  # the zone profile's refusal, for logs


def test_a_full_region_queues_when_no_peer_can_take_it() -> None:
    full_peer = peer("r2", saturated_models=("m",))
    spilling_peer = peer("r3", spill_out_per_s=2.0)
    regional = view([zone("a", FULL)], [full_peer, spilling_peer])
    assert decide(regional).route is Route.QUEUE


@pytest.mark.parametrize(
    ("given", "why"),
    [
        (inputs(on_saturation=SaturationPolicy.REJECT), "reject"),
        (inputs(known=False), "unknown client country"),
        (inputs(hops=2), "out of hops"),
        (inputs(spilled_from=("r2",)), "came from there"),
        (inputs(frozenset({"r1"})), "peer not allowed"),
    ],
)
def test_no_spill(given: Inputs, why: str) -> None:
    regional = view([zone("a", FULL)], [peer("r2")])
    decision = decide(regional, given)
    assert decision.route is Route.QUEUE, why


def test_unknown_location_may_spill_when_configured() -> None:
    regional = view([zone("a", FULL)], [peer("r2")])
    decision = decide(
        regional, inputs(known=False), using=router(spill_requires_client_country=False)
    )
    assert decision.route is Route.SPILL


def test_spill_decisions_are_rate_limited_per_peer() -> None:
    limited = RegionalRouter(
        build(profile_spec(None)),
        saturation_filter="saturation",
        limiter=SpillLimiter(SpillSettings(per_peer_rate=0.0, per_peer_burst=2.0)),
    )
    regional = view([zone("a", FULL)], [peer("r2")])
    routes = [decide(regional, using=limited, request_id=f"q{i}").route for i in range(4)]
    assert routes == [Route.SPILL, Route.SPILL, Route.QUEUE, Route.QUEUE]


def test_residency_excluding_this_region_is_refused() -> None:
    decision = decide(view([zone("a")]), inputs(frozenset({"r2"})))
    assert (decision.route, decision.reason) == (Route.REFUSE, Reason.RESIDENCY)


def test_a_model_served_nowhere_allowed_is_not_found() -> None:
    regional = view([zone("a", model_load(model="other"))], [peer("r9")])
    decision = decide(regional)
    assert (decision.route, decision.reason) == (Route.REFUSE, Reason.MODEL_NOT_FOUND)


def test_no_healthy_zone_and_no_peer_is_unavailable() -> None:
    regional = view([zone("a", healthy=False), zone("b", drained=True)])
    strict = router(panic_mode=PanicMode.NONE)  # Envoy's fail_traffic_on_panic
    decision = decide(regional, inputs(frozenset({"r1"})), using=strict)
    assert (decision.route, decision.reason) == (Route.REFUSE, Reason.UNAVAILABLE)


def test_no_healthy_zone_spills_to_a_peer() -> None:
    regional = view([zone("a", model_load(healthy=0))], [peer("r2")])
    decision = decide(regional)
    assert decision.route is Route.SPILL
    assert decision.reason in (Reason.UNAVAILABLE, Reason.DEGRADED)


def test_a_drained_region_sends_everything_to_peers() -> None:
    regional = view([zone("a")], [peer("r2")], drained=True)
    decision = decide(regional)
    assert (decision.route, decision.reason) == (Route.SPILL, Reason.DRAINED)
    assert decide(view([zone("a")], drained=True)).route is Route.LOCAL  # nowhere else


def test_envoy_mode_keeps_traffic_home_down_to_71_percent_health() -> None:
    # 3 of 4 GPUs healthy (75 % x 1.4 > 100 %): nothing spills.
    regional = view([zone("a", model_load(gpus=4, healthy=3))], [peer("r2")])
    envoy = router(split_mode=SplitMode.ENVOY)
    routes = {decide(regional, using=envoy, request_id=f"q{i}").route for i in range(200)}
    assert routes == {Route.LOCAL}


def test_envoy_mode_a_sick_zone_sheds_load_to_peers_in_proportion() -> None:
    # One of two equal zones lost: 50 % healthy x 1.4 = 70 % stays, 30 % spills,
    # whatever the demand (Envoy's split counts healthy GPUs, not load).
    regional = view(
        [zone("a"), zone("b", model_load(healthy=0))], [peer("r2", model_load(gpus=10))]
    )
    limiter = SpillLimiter(SpillSettings(per_peer_rate=0.0, per_peer_burst=1e9))
    spiller = RegionalRouter(
        build(profile_spec(None)),
        saturation_filter="saturation",
        limiter=limiter,
        settings=RouterSettings(split_mode=SplitMode.ENVOY),
    )
    routes = [decide(regional, using=spiller, request_id=f"q{i}").route for i in range(2000)]
    spilled = routes.count(Route.SPILL) / len(routes)
    assert spilled == pytest.approx(0.3, abs=0.04)
    # The same request always gets the same answer (the draw is seeded by its id).
    assert decide(regional, using=spiller, request_id="q7").route is routes[7]


def test_panic_ignores_health_when_too_little_is_left() -> None:
    # 1 of 4 GPUs healthy and no peer: below Envoy's 50 % panic threshold, so a zone
    # that reports itself unhealthy is used too (here it is the cheaper one).
    regional = view(
        [
            zone("a", model_load(gpus=2, healthy=1, queued=90_000)),
            zone("b", model_load(gpus=2, healthy=0)),
        ]
    )
    decision = decide(regional, inputs(frozenset({"r1"})))
    assert decision.split is not None
    assert decision.split.local_panic
    assert decision.zone is not None
    assert decision.zone.id == "a"  # b has no healthy GPU to price it with
    sick = view([zone("a", model_load(gpus=2), healthy=False), zone("c", drained=True)])
    panicked = decide(sick, inputs(frozenset({"r1"})))
    assert panicked.zone is not None
    assert panicked.zone.id == "a"  # never the drained one
    strict = decide(sick, inputs(frozenset({"r1"})), using=router(panic_mode=PanicMode.NONE))
    assert strict.route is Route.REFUSE


def test_place_skips_excluded_zones_and_reports_full() -> None:
    regional = view([zone("a"), zone("b", model_load(queued=90_000))])
    r = router()
    placed = r.place(
        route_request(), regional, inputs(), accounting=None, excluded=frozenset({"a"})
    )
    assert placed is not None
    assert placed.zone is not None
    assert placed.zone.id == "b"
    assert (
        r.place(
            route_request(), regional, inputs(), accounting=None, excluded=frozenset({"a", "b"})
        )
        is None
    )


def test_no_draw_is_made_while_the_whole_load_stays_local(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A healthy region with peers keeps everything home (local share 1): a draw is below
    # 1, so the outcome needs none, and seeding a generator per request is wasted work.
    regional = view([zone("a", model_load(queued=1_000))], [peer("r2", rtt=20.0)])
    spiller = router()

    def no_draw(_request: object) -> float:
        raise AssertionError("drew a number for a request that stays local")

    monkeypatch.setattr(spiller, "_draw", no_draw)
    decision = decide(regional, using=spiller)
    assert decision.route is Route.LOCAL
    assert decision.split is not None
    assert decision.split.local_load >= 1.0

"""The regional fast path (regional_lb.fastpath) decides exactly as the reference profile.

Property: on random views (zones healthy or not, drained, dark, full, without URL, with
hot prefixes; peers with or without room), random accounting, requests, residency
inputs, split and panic settings and profiles, a router with the fast path and
``trace=False`` returns, decision after decision, the reference router's decision but
for the trace record (``decision``) — and ``place`` does too. The routers keep state
(spill limiter, demand meter), so each example runs a sequence of decisions on both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtm.models import RouteRequest
from gtm.routing import load_profile_spec
from policies.documents import SaturationPolicy
from regional_lb.fastpath import Deferred, FastZoneChoice
from regional_lb.plugins.ttft import TtftScorer
from regional_lb.priority import (
    CapacitySettings,
    SplitMode,
    split,
    zone_headroom,
)
from regional_lb.profiles import DEFAULT_PROFILE, build, profile_spec, with_saturation_last
from regional_lb.router import (
    Inputs,
    PanicMode,
    RegionalDecision,
    RegionalRouter,
    Route,
    RouterSettings,
)
from regional_lb.spill import PeerOption, SpillSettings, peer_ttft_ms, spill_options, why_not
from regional_lb.view import (
    PeerInfo,
    RegionalView,
    ZoneAccounting,
    ZoneContext,
    ZoneInfo,
    ZoneState,
    capacity_health,
    is_saturated,
    zone_candidates,
)
from tests.unit.regional_lb.helpers import MODEL, NOW, model_load, peer, view, zone

REGION = "r1"
PEERS = ("r2", "r3", "r4")
BLOCKS = (11, 12, 13, 14, 15)


def _profile(scorers: list[dict[str, Any]], picker: str = "max-score") -> dict[str, Any]:
    return {
        "name": "regional-default",
        "plugins": [
            {"type": "residency-filter", "name": "residency"},
            {"type": "health-filter", "name": "health"},
            {"type": "model-filter", "name": "model"},
            {"type": "ttft-scorer", "name": "ttft", "parameters": {"scale_ms": 50.0}},
            {"type": "prefix-affinity-scorer", "name": "prefix-affinity"},
            {"type": "load-scorer", "name": "load"},
            {"type": "kv-cache-scorer", "name": "kv"},
            {"type": "max-score-picker", "name": "max-score"},
        ],
        "profile": {
            "filters": ["residency", "health", "model"],
            "scorers": scorers,
            "picker": picker,
            "cost_model": "ttft",
        },
    }


SPECS = [
    profile_spec(None),
    with_saturation_last(load_profile_spec(_profile([]))),
    with_saturation_last(
        load_profile_spec(
            _profile(
                [
                    {"ref": "load", "weight": 2.0},
                    {"ref": "ttft", "weight": 1.0},
                    {"ref": "kv", "weight": 0.5},
                ]
            )
        )
    ),
    with_saturation_last(
        load_profile_spec(
            _profile([{"ref": "prefix-affinity", "weight": 1.0}, {"ref": "kv", "weight": 3.0}])
        )
    ),
]

loads = st.builds(
    lambda gpus, healthy, running, waiting, queued, rate, kv, model: model_load(
        gpus=gpus,
        healthy=min(healthy, gpus),
        running=running,
        waiting=waiting,
        queued=queued,
        rate=rate,
        kv=kv,
        model=model,
    ),
    gpus=st.integers(0, 4),
    healthy=st.integers(0, 4),
    running=st.integers(0, 20),
    waiting=st.sampled_from([0, 0, 3, 40]),
    queued=st.integers(0, 100_000),
    rate=st.sampled_from([0.0, 5_000.0, 10_000.0, 10_000.0]),
    kv=st.sampled_from([(0, 0), (100, 90), (100, 10), (100, 50)]),
    model=st.sampled_from([MODEL, MODEL, MODEL, "other"]),
)


@st.composite
def zones(draw: st.DrawFn, index: int) -> ZoneInfo:
    info = zone(
        f"z{index}",
        draw(loads),
        region=REGION,
        healthy=draw(st.booleans() | st.just(True)),
        drained=draw(st.sampled_from([False, False, False, True])),
        sketch=tuple(draw(st.lists(st.sampled_from(BLOCKS), max_size=4, unique=True))),
        rtt=draw(st.sampled_from([0.5, 2.0, 2.0])),
        summary=draw(st.sampled_from([True, True, True, False])),
    )
    if draw(st.integers(0, 9)) == 0:
        info = dataclasses.replace(info, url=None)
    return info


@st.composite
def peers(draw: st.DrawFn, region: str) -> PeerInfo:
    return peer(
        region,
        draw(loads),
        rtt=draw(st.sampled_from([10.0, 50.0, 120.0])),
        drained=draw(st.sampled_from([False, False, True])),
        saturation=draw(st.sampled_from([0.0, 0.5, 0.95])),
        spill_out_per_s=draw(st.sampled_from([0.0, 0.0, 3.0])),
    )


@st.composite
def views(draw: st.DrawFn) -> RegionalView:
    count = draw(st.integers(1, 4))
    chosen = draw(st.lists(st.sampled_from(PEERS), max_size=3, unique=True))
    return view(
        [draw(zones(i)) for i in range(count)],
        [draw(peers(p)) for p in chosen],
        region=REGION,
        drained=draw(st.sampled_from([False, False, False, True])),
    )


@st.composite
def inputs(draw: st.DrawFn) -> Inputs:
    allowed = {REGION} if draw(st.integers(0, 9)) else set()
    allowed |= set(draw(st.lists(st.sampled_from(PEERS), max_size=3, unique=True)))
    return Inputs(
        allowed=frozenset(allowed),
        on_saturation=draw(st.sampled_from(list(SaturationPolicy))),
        hops=draw(st.integers(0, 2)),
        spilled_from=tuple(draw(st.lists(st.sampled_from(PEERS), max_size=1))),
        client_country_known=draw(st.booleans() | st.just(True)),
        tokens_per_block=draw(st.sampled_from([0.0, 512.0, 64.0])),
    )


requests = st.builds(
    lambda rid, tokens, prefix, model: RouteRequest(
        request_id=rid, model=model, input_tokens=tokens, tenant="t1", prefix_hashes=prefix
    ),
    rid=st.text("abcdef0123456789", min_size=1, max_size=8),
    tokens=st.integers(0, 40_000),
    prefix=st.lists(st.sampled_from(BLOCKS), max_size=4).map(tuple),
    model=st.sampled_from([MODEL, MODEL, MODEL, "other"]),
)


#: Profiles and fast paths are stateless: built once per spec. Routers are not (spill
#: limiter, demand meter): each example gets fresh ones.
PROFILES = [(build(spec), FastZoneChoice.compile(spec)) for spec in SPECS]


def _routers(which: int, split_mode: SplitMode, panic: PanicMode) -> list[RegionalRouter]:
    profile, fast_path = PROFILES[which]
    router_settings = RouterSettings(split_mode=split_mode, panic_mode=panic)
    return [
        RegionalRouter(
            profile,
            saturation_filter="saturation",
            settings=router_settings,
            fast=fast_path if fast else None,
        )
        for fast in (True, False)
    ]


def _same(fast: RegionalDecision | None, slow: RegionalDecision | None) -> None:
    if slow is None or fast is None:
        assert fast is slow
        return
    # The fast path leaves out only the trace record of a local choice.
    if fast.decision is None and slow.decision is not None:
        assert slow.route is Route.LOCAL
        assert slow.decision.choice == (fast.zone.id if fast.zone is not None else None)
        slow = dataclasses.replace(slow, decision=None)
    assert fast == slow


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    which=st.integers(0, len(SPECS) - 1),
    split_mode=st.sampled_from(list(SplitMode)),
    panic=st.sampled_from(list(PanicMode)),
    regional=views(),
    steps=st.lists(st.tuples(requests, inputs(), st.integers(0, 3)), min_size=1, max_size=4),
    sent=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30_000)), max_size=6),
    excluded=st.sets(st.sampled_from(["z0", "z1", "z2"]), max_size=2),
)
def test_fast_path_decides_like_the_reference(
    which: int,
    split_mode: SplitMode,
    panic: PanicMode,
    regional: RegionalView,
    steps: list[tuple[RouteRequest, Inputs, int]],
    sent: list[tuple[int, int]],
    excluded: set[str],
) -> None:
    fast, slow = _routers(which, split_mode, panic)
    accounting = ZoneAccounting()
    accounting.observe(regional.zones)
    zone_ids = list(regional.zones)
    # Requests sent since the summaries (unseen by them): they count towards saturation.
    for index, tokens in sent:
        accounting.start(zone_ids[index % len(zone_ids)], MODEL, tokens)
    for step, (request, given_inputs, extra) in enumerate(steps):
        now = NOW + step * 0.01
        a = fast.decide(
            request,
            regional,
            given_inputs,
            accounting=accounting,
            now=now,
            now_wall=now,
            trace=False,
        )
        b = slow.decide(
            request, regional, given_inputs, accounting=accounting, now=now, now_wall=now
        )
        _same(a, b)
        if a.route is Route.LOCAL and a.zone is not None:
            for _ in range(extra):  # what the service charges at dispatch
                accounting.start(a.zone.id, request.model, request.input_tokens)
        tried = frozenset(excluded)
        _same(
            fast.place(
                request, regional, given_inputs, accounting=accounting, excluded=tried, trace=False
            ),
            slow.place(request, regional, given_inputs, accounting=accounting, excluded=tried),
        )


def _plain_view() -> RegionalView:
    return view(
        [zone("a", model_load(queued=50_000)), zone("b", model_load(queued=1_000))],
        region=REGION,
    )


def _plain_inputs() -> Inputs:
    return Inputs(allowed=frozenset({REGION}), on_saturation=SaturationPolicy.REJECT)


def test_the_fast_path_is_taken_and_leaves_out_only_the_trace() -> None:
    fast, slow = _routers(0, SplitMode.CAPACITY, PanicMode.ALL)
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=1000, tenant="t1")
    regional = _plain_view()
    a = fast.decide(
        request, regional, _plain_inputs(), accounting=None, now=NOW, now_wall=NOW, trace=False
    )
    b = slow.decide(request, regional, _plain_inputs(), accounting=None, now=NOW, now_wall=NOW)
    assert a.zone is not None
    assert a.zone.id == "b"
    assert a.decision is None  # no trace built: the fast path chose
    assert b.decision is not None
    assert b.decision.choice == "b"
    assert a == dataclasses.replace(b, decision=None)
    # Asked for the trace, the router with a fast path runs the reference (both routers
    # have now metered the same demand twice).
    traced = fast.decide(request, regional, _plain_inputs(), accounting=None, now=NOW, now_wall=NOW)
    again = slow.decide(request, regional, _plain_inputs(), accounting=None, now=NOW, now_wall=NOW)
    assert traced.decision is not None
    assert traced == again


def test_a_scorer_outside_its_contract_defers_to_the_reference() -> None:
    class Broken:
        name = "broken"

        def score(self, request: object, candidates: Any, ctx: object) -> dict[str, float]:
            return {c.id: 7.0 for c in candidates}

    choice = FastZoneChoice.compile(profile_spec(None))
    broken = FastZoneChoice(choice._filters, [(Broken(), 1.0)], choice._picker)
    regional = _plain_view()
    zones = zone_candidates(regional, MODEL)
    ctx = ZoneContext(regional, frozenset({REGION}))
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=10, tenant="t1")
    assert choice.choose(request, zones, ctx) is not None
    assert broken.choose(request, zones, ctx) is None
    assert broken.pick(request, zones, ctx) is Deferred.REFERENCE


def test_every_zone_filtered_out_defers_to_the_reference() -> None:
    choice = FastZoneChoice.compile(profile_spec(None))
    regional = view([zone("a", model_load(), drained=True)], region=REGION)
    request = RouteRequest(request_id="r", model=MODEL, input_tokens=10, tenant="t1")
    ctx = ZoneContext(regional, frozenset({REGION}))
    zones = zone_candidates(regional, MODEL)
    assert choice.choose(request, zones, ctx) is None
    # place() needs nothing more than "no zone now"; decide() runs the reference for
    # the refusal's filter name and trace.
    assert choice.pick(request, zones, ctx) is Deferred.EMPTY
    assert choice.pick(request, (), ctx) is Deferred.EMPTY


def test_compile_refuses_what_the_reference_refuses() -> None:
    data = dict(DEFAULT_PROFILE)
    data["profile"] = {**DEFAULT_PROFILE["profile"], "scorers": [{"ref": "nope", "weight": 1}]}
    with pytest.raises(Exception, match="nope"):
        FastZoneChoice.compile(load_profile_spec(data))


def _reference_candidates(
    regional: RegionalView, model: str, accounting: ZoneAccounting
) -> tuple[ZoneState, ...]:
    """zone_candidates as written before the per-view memo: every check per call."""
    out = []
    for info in regional.zones.values():
        load = info.summary.load_for(model) if info.summary is not None else None
        unseen = accounting.unseen(info.id, model)
        full = load is None or is_saturated(load, unseen[0], regional.settings)
        panicked = load is None or is_saturated(
            load, unseen[0], regional.settings, all_healthy=True
        )
        out.append(ZoneState(info.id, info, load, unseen[0], unseen[1], full, panicked))
    return tuple(out)


def _reference_options(
    regional: RegionalView, request: RouteRequest, given: Inputs, now_wall: float
) -> tuple[PeerOption, ...]:
    """spill_options as written before the per-view memo: why_not and peer_ttft_ms."""
    spill = SpillSettings()
    if given.hops >= spill.max_hops:
        return ()
    excluded = frozenset((regional.region, *given.spilled_from))
    options = []
    for info in regional.peers.values():
        reason = why_not(
            info,
            request,
            allowed=given.allowed,
            excluded=excluded,
            now_wall=now_wall,
            settings=spill,
        )
        if reason is not None or info.summary is None or info.url is None:
            continue
        ttft = peer_ttft_ms(info.summary, request)
        if math.isfinite(ttft):
            options.append(PeerOption(info.id, info.url, info.rtt_ms, ttft))
    options.sort(key=lambda o: (o.cost_ms, o.region))
    return tuple(options)


#: Loads near the saturation edges (busy = limit, KV at the threshold, no room).
edge_loads = st.builds(
    lambda gpus, healthy, running, waiting, max_running, kv, rate, model: model_load(
        gpus=gpus,
        healthy=min(healthy, gpus),
        running=running,
        waiting=waiting,
        max_running=max_running,
        kv=kv,
        rate=rate,
        model=model,
    ),
    gpus=st.integers(0, 3),
    healthy=st.integers(0, 3),
    running=st.integers(0, 24),
    waiting=st.sampled_from([0, 0, 3]),
    max_running=st.sampled_from([0, 4, 8]),
    kv=st.sampled_from([(0, 0), (100, 20), (100, 21), (100, 90)]),
    rate=st.sampled_from([0.0, 10_000.0, 10_000.0, 10_000.0]),
    model=st.sampled_from([MODEL, MODEL, MODEL, "other"]),
)


@st.composite
def edge_views(draw: st.DrawFn) -> RegionalView:
    zone_infos = [
        zone(f"z{i}", draw(edge_loads), region=REGION, healthy=draw(st.booleans()))
        for i in range(draw(st.integers(1, 3)))
    ]
    peer_infos = [
        peer(
            p,
            draw(edge_loads),
            rtt=draw(st.sampled_from([10.0, 50.0])),
            drained=draw(st.sampled_from([False, False, False, True])),
            saturation=draw(st.sampled_from([0.0, 0.0, 0.0, 0.95])),
            spill_out_per_s=draw(st.sampled_from([0.0, 0.0, 0.0, 3.0])),
        )
        for p in PEERS
        if draw(st.integers(0, 3))
    ]
    return view(zone_infos, peer_infos, region=REGION)


edge_inputs = st.builds(
    lambda allowed, hops, spilled_from: Inputs(
        allowed=frozenset({REGION, *allowed}),
        on_saturation=SaturationPolicy.SPILL_WITHIN_ALLOWED,
        hops=hops,
        spilled_from=tuple(spilled_from),
    ),
    allowed=st.lists(st.sampled_from(PEERS), max_size=3, unique=True),
    hops=st.sampled_from([0, 0, 1, 2]),
    spilled_from=st.lists(st.sampled_from(PEERS), max_size=1),
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    regional=edge_views(),
    steps=st.lists(
        st.tuples(requests, edge_inputs, st.sampled_from([0.0, 5.0, 10.0, 30.0])),
        min_size=1,
        max_size=4,
    ),
    sent=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30_000)), max_size=6),
)
def test_per_view_memo_gives_the_per_call_candidates_and_spill_options(
    regional: RegionalView,
    steps: list[tuple[RouteRequest, Inputs, float]],
    sent: list[tuple[int, int]],
) -> None:
    # Candidates and peers derived once per view, then corrected per call (accounting,
    # residency, path, summary age), equal what every check per call gives.
    accounting = _charged(regional, sent)
    zone_ids = list(regional.zones)
    for request, given_inputs, later in steps:
        for model in (request.model, MODEL):
            expected = _reference_candidates(regional, model, accounting)
            assert zone_candidates(regional, model, accounting) == expected
        now_wall = NOW + later  # 10 s: at the age limit, 30 s: every summary is stale
        got = spill_options(
            regional,
            request,
            allowed=given_inputs.allowed,
            spilled_from=given_inputs.spilled_from,
            hops=given_inputs.hops,
            now_wall=now_wall,
            settings=SpillSettings(),
        )
        assert got == _reference_options(regional, request, given_inputs, now_wall)
        accounting.start(zone_ids[0], request.model, request.input_tokens)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    regional=views(),
    request=requests,
    given_inputs=inputs(),
    sent=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30_000)), max_size=6),
)
def test_the_ttft_scorers_costs_are_its_cost_model_zone_by_zone(
    regional: RegionalView, request: RouteRequest, given_inputs: Inputs, sent: list[tuple[int, int]]
) -> None:
    # The scorer works out every zone's cost inline; each must be cost_ms to the bit.
    candidates = zone_candidates(regional, request.model, _charged(regional, sent))
    ctx = ZoneContext(regional, given_inputs.allowed, False, given_inputs.tokens_per_block)
    scorer = TtftScorer()
    costs = scorer.costs_ms(request, candidates, ctx)
    assert list(costs) == [c.id for c in candidates]
    for candidate in candidates:
        assert costs[candidate.id] == scorer.cost_ms(request, candidate, ctx)


def _reference_peer_split(
    regional: RegionalView, options: tuple[PeerOption, ...], model: str
) -> tuple[int, int, float]:
    """The peers' (healthy, total, headroom) as the split summed them before the per-view
    memo: each option's summary read per call."""
    capacity = CapacitySettings()
    healthy = total = 0
    elsewhere = 0.0
    for option in options:
        summary = regional.peers[option.region].summary
        found = summary.load_for(model) if summary is not None else None
        if found is not None:
            healthy += found.healthy_gpus
            total += found.gpus
            elsewhere += zone_headroom(
                found.prefill_tokens_per_s,
                found.queued_prefill_tokens,
                target_utilisation=capacity.target_utilisation,
                backlog_horizon_s=capacity.backlog_horizon_s,
            )
    return healthy, total, elsewhere


@settings(max_examples=300, derandomize=True, deadline=None)
@given(regional=views(), request=requests, given_inputs=inputs())
def test_the_split_reads_the_peers_capacity_as_their_summaries_give_it(
    regional: RegionalView, request: RouteRequest, given_inputs: Inputs
) -> None:
    router = _routers(0, SplitMode.CAPACITY, PanicMode.ALL)[0]
    options = spill_options(
        regional,
        request,
        allowed=given_inputs.allowed | set(PEERS),
        hops=0,
        now_wall=NOW,
        settings=SpillSettings(),
    )
    zones = zone_candidates(regional, request.model, None)
    got = router._split(zones, options, request, regional, NOW)
    healthy, total, elsewhere = _reference_peer_split(regional, options, request.model)
    assert got.peer_headroom_tokens_per_s == max(0.0, elsewhere)
    expected = split(capacity_health(zones, request.model), (healthy, total))
    assert (got.local_health, got.spill_health, got.local_panic) == (
        expected.local_health,
        expected.spill_health,
        expected.local_panic,
    )


def _charged(regional: RegionalView, sent: list[tuple[int, int]]) -> ZoneAccounting:
    """The view's zones observed, then ``sent``'s (zone index, prompt tokens) charged."""
    accounting = ZoneAccounting()
    accounting.observe(regional.zones)
    zone_ids = list(regional.zones)
    for index, tokens in sent:
        accounting.start(zone_ids[index % len(zone_ids)], MODEL, tokens)
    return accounting

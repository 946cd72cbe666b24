"""Zone choice on the core runner decides as the regional profile is specified, and the
per-view memos give what every check per call gives.

Property: on random views (zones healthy or not, drained, dark, full, without URL, with
hot prefixes), random accounting, requests, residency inputs and profiles, the regional
profile (``gtm.routing.Runner`` over a ``ZoneBatch``) refuses naming the filter, or
chooses the zone, that a plain-Python oracle of the specification gives: filters as
predicates in order, ``Σ wᵢ·sᵢ / Σ wᵢ`` summed left to right over the survivors (scores
repaired into [0, 1]), the highest total, ties to the smallest id; its predicted TTFT is
the scalar cost of the choice. Routers with and without ``trace`` decide alike.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtm.errors import NoEligibleCandidate
from gtm.models import ModelLoad, RouteRequest
from gtm.routing import ProfileSpec, load_profile_spec
from gtm.routing.cost import matching_prefix_blocks, scores_from_costs
from policies.documents import SaturationPolicy
from regional_lb.plugins.ttft import predicted_ttft_ms, uncached_tokens
from regional_lb.priority import (
    CapacitySettings,
    SplitMode,
    split,
    zone_headroom,
)
from regional_lb.profiles import build, profile_spec, with_saturation_last
from regional_lb.router import (
    Inputs,
    PanicMode,
    RegionalRouter,
    RouterSettings,
)
from regional_lb.spill import PeerOption, SpillSettings, peer_ttft_ms, spill_options, why_not
from regional_lb.view import (
    PeerInfo,
    RegionalView,
    ZoneAccounting,
    ZoneBatch,
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


def _loads(**fields: Any) -> st.SearchStrategy[ModelLoad]:
    """Model loads drawn from ``fields`` (healthy GPUs capped at the GPUs), a quarter of
    them for another model."""

    def build(gpus: int, healthy: int, **rest: Any) -> ModelLoad:
        return model_load(gpus=gpus, healthy=min(healthy, gpus), **rest)

    return st.builds(build, model=st.sampled_from([MODEL, MODEL, MODEL, "other"]), **fields)


loads = _loads(
    gpus=st.integers(0, 4),
    healthy=st.integers(0, 4),
    running=st.integers(0, 20),
    waiting=st.sampled_from([0, 0, 3, 40]),
    queued=st.integers(0, 100_000),
    rate=st.sampled_from([0.0, 5_000.0, 10_000.0, 10_000.0]),
    kv=st.sampled_from([(0, 0), (100, 90), (100, 10), (100, 50)]),
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


#: Profiles are stateless: built once per spec. Routers are not (spill limiter, demand
#: meter): each example gets fresh ones.
PROFILES = [build(spec) for spec in SPECS]


def _routers(which: int, split_mode: SplitMode, panic: PanicMode) -> list[RegionalRouter]:
    router_settings = RouterSettings(split_mode=split_mode, panic_mode=panic)
    return [RegionalRouter(PROFILES[which], settings=router_settings) for _ in range(2)]


def _keeps(spec: ProfileSpec, name: str, zone: ZoneState, ctx: ZoneContext) -> bool:
    """The filters' specification, as predicates."""
    kind = next(p.type for p in spec.plugins if p.plugin_name == name)
    if kind == "residency-filter":
        return ctx.allowed is None or ctx.region in ctx.allowed
    if kind == "health-filter":
        if zone.drained or zone.id in ctx.excluded or zone.info.url is None:
            return False
        return ctx.panic or zone.healthy
    if kind == "model-filter":
        return zone.serves_model
    assert kind == "saturation-filter"
    return not (zone.saturated_in_panic if ctx.panic else zone.saturated)


def _scores(
    spec: ProfileSpec, name: str, request: RouteRequest, zones: list[ZoneState], ctx: ZoneContext
) -> list[float]:
    """The scorers' specification, over the survivors (repaired into [0, 1])."""
    plugin = next(p for p in spec.plugins if p.plugin_name == name)
    if plugin.type == "ttft-scorer":
        costs = {z.id: predicted_ttft_ms(z, uncached_tokens(request, z, ctx)) for z in zones}
        scale = float(plugin.parameters.get("scale_ms", 200.0))  # type: ignore[arg-type]
        values = list(scores_from_costs(costs, scale).values())
    elif plugin.type == "prefix-affinity-scorer":
        hashes = request.prefix_hashes
        values = [
            matching_prefix_blocks(hashes, z.info.sketch) / len(hashes) if hashes else 0.0
            for z in zones
        ]
    elif plugin.type == "load-scorer":
        values = [1.0 - z.utilisation() for z in zones]
    else:
        assert plugin.type == "kv-cache-scorer"
        values = [z.kv_free_fraction() for z in zones]
    return [min(1.0, max(0.0, v)) for v in values]


def _oracle(
    spec: ProfileSpec, request: RouteRequest, zones: tuple[ZoneState, ...], ctx: ZoneContext
) -> tuple[str, str]:
    """("refuse", the filter that emptied the set) or ("choose", the zone id)."""
    survivors = list(zones)
    for name in spec.profile.filters:
        survivors = [z for z in survivors if _keeps(spec, name, z, ctx)]
        if not survivors:
            return "refuse", name
    totals = [0.0] * len(survivors)
    weight_sum = 0.0
    for ref in spec.profile.scorers:
        column = _scores(spec, ref.ref, request, survivors, ctx)
        totals = [t + ref.weight * s for t, s in zip(totals, column, strict=True)]
        weight_sum += ref.weight
    if spec.profile.scorers:
        totals = [t / weight_sum for t in totals]
    best = max(totals)
    return "choose", min(z.id for z, t in zip(survivors, totals, strict=True) if t == best)


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    which=st.integers(0, len(SPECS) - 1),
    regional=views(),
    request=requests,
    given_inputs=inputs(),
    panic=st.booleans(),
    sent=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30_000)), max_size=6),
    excluded=st.sets(st.sampled_from(["z0", "z1", "z2"]), max_size=2),
)
def test_the_profile_decides_as_its_specification(
    which: int,
    regional: RegionalView,
    request: RouteRequest,
    given_inputs: Inputs,
    panic: bool,
    sent: list[tuple[int, int]],
    excluded: set[str],
) -> None:
    spec = SPECS[which]
    zones = zone_candidates(regional, request.model, _charged(regional, sent))
    ctx = ZoneContext(
        regional, given_inputs.allowed, panic, given_inputs.tokens_per_block, frozenset(excluded)
    )
    verdict, expected = _oracle(spec, request, zones, ctx)
    if verdict == "refuse":
        with pytest.raises(NoEligibleCandidate) as refused:
            PROFILES[which].decide(ZoneBatch(request, zones, ctx))
        assert refused.value.filter_name == expected
        return
    outcome = PROFILES[which].decide(ZoneBatch(request, zones, ctx))
    assert outcome.choice_id == expected
    chosen = zones[outcome.choice]
    cost = predicted_ttft_ms(chosen, uncached_tokens(request, chosen, ctx))
    assert outcome.predicted_ttft_ms == (cost if math.isfinite(cost) else None)
    assert outcome.to_decision().choice == expected


@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    regional=views(),
    steps=st.lists(st.tuples(requests, inputs()), min_size=1, max_size=4),
    split_mode=st.sampled_from(list(SplitMode)),
    panic=st.sampled_from(list(PanicMode)),
)
def test_a_decision_without_its_trace_is_the_traced_one(
    regional: RegionalView,
    steps: list[tuple[RouteRequest, Inputs]],
    split_mode: SplitMode,
    panic: PanicMode,
) -> None:
    plain, traced = _routers(0, split_mode, panic)
    for step, (request, given_inputs) in enumerate(steps):
        now = NOW + step * 0.01
        a = plain.decide(
            request, regional, given_inputs, accounting=None, now=now, now_wall=now, trace=False
        )
        b = traced.decide(request, regional, given_inputs, accounting=None, now=now, now_wall=now)
        assert a.decision is None
        if b.outcome is not None:
            assert b.decision is not None
            assert b.decision.choice == (a.zone.id if a.zone is not None else None)
        assert a == dataclasses.replace(b, outcome=None)


def _reference_candidates(
    regional: RegionalView, model: str, accounting: ZoneAccounting
) -> tuple[ZoneState, ...]:
    """zone_candidates as written before the per-view memo: every check per call."""
    out = []
    count_only = dataclasses.replace(regional.settings, kv_cache_util_threshold=math.inf)
    for info in regional.zones.values():
        load = info.summary.load_for(model) if info.summary is not None else None
        unseen = accounting.unseen(info.id, model)
        full = load is None or is_saturated(load, unseen[0], regional.settings)
        panicked = load is None or is_saturated(
            load, unseen[0], regional.settings, all_healthy=True
        )
        # Full, but not without its KV threshold: full by its KV cache use alone.
        kv_bound = full and not (load is None or is_saturated(load, unseen[0], count_only))
        out.append(ZoneState(info.id, info, load, unseen[0], unseen[1], full, panicked, kv_bound))
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
edge_loads = _loads(
    gpus=st.integers(0, 3),
    healthy=st.integers(0, 3),
    running=st.integers(0, 24),
    waiting=st.sampled_from([0, 0, 3]),
    max_running=st.sampled_from([0, 4, 8]),
    kv=st.sampled_from([(0, 0), (100, 20), (100, 21), (100, 90)]),
    rate=st.sampled_from([0.0, 10_000.0, 10_000.0, 10_000.0]),
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

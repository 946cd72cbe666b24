"""The regional LB keeps a conversation in the zone its prefix was just sent to."""

from __future__ import annotations

from gtm.models import GpuClassLoad, ModelLoad
from gtm.routing.placement import PlacementMemory
from policies.documents import SaturationPolicy
from regional_lb.plugins.prefix import ZoneMemory, can_hold, sticky_zone
from regional_lb.profiles import build, profile_spec
from regional_lb.router import Inputs, RegionalDecision, RegionalRouter, Route
from regional_lb.view import ZoneState, zone_candidates
from tests.unit.regional_lb.helpers import NOW, model_load, route_request, view, zone

#: A conversation's prompt: 8 blocks of 500 tokens.
PROMPT = tuple(range(100, 108))
TOKENS = 4000
PER_BLOCK = 500.0


def _zones(queued_a: int = 0, queued_b: int = 0, running_a: int = 0) -> tuple[ZoneState, ...]:
    regional = view(
        [
            zone("a", model_load(queued=queued_a, running=running_a)),
            zone("b", model_load(queued=queued_b)),
        ]
    )
    return zone_candidates(regional, "m")


def _place(memory: ZoneMemory, chosen: str, zones: tuple[ZoneState, ...], now: float) -> str:
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    picked = next(z for z in zones if z.id == chosen)
    return memory.place(picked, request, lambda: zones, tokens_per_block=PER_BLOCK, now=now).id


def test_a_repeat_right_after_dispatch_goes_back_to_the_same_zone() -> None:
    memory = ZoneMemory()
    zones = _zones()
    assert _place(memory, "a", zones, NOW - 1.0) == "a"
    # The zone sketches know nothing yet; the profile would pick b for the next turn.
    assert _place(memory, "b", zones, NOW - 0.5) == "a"


def test_after_the_ttl_the_profile_decides() -> None:
    memory = ZoneMemory(PlacementMemory(ttl_s=5.0))
    zones = _zones()
    assert _place(memory, "a", zones, NOW - 10.0) == "a"
    assert _place(memory, "b", zones, NOW - 4.0) == "b"


def test_affinity_yields_when_the_zone_is_saturated_or_its_queue_outweighs_the_cache() -> None:
    memory = ZoneMemory()
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    memory.memory.remember(PROMPT, "a", NOW - 1.0)
    recall = memory.memory.recall(PROMPT, NOW)
    full = _zones(running_a=40)  # past the zone's capacity: saturated
    assert full[0].saturated
    assert sticky_zone(recall, full[1], full, request, tokens_per_block=PER_BLOCK) is full[1]
    # A queue at a far longer than the prefill the cache saves.
    queued = _zones(queued_a=200_000)
    assert sticky_zone(recall, queued[1], queued, request, tokens_per_block=PER_BLOCK) is queued[1]
    idle = _zones()
    assert sticky_zone(recall, idle[1], idle, request, tokens_per_block=PER_BLOCK) is idle[0]


def test_the_previous_turn_a_newer_summary_still_shows_queued_is_not_held_against_it() -> None:
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    previous = 10_000  # tokens of the previous turn's prompt
    # A's summary (published at NOW) counts 10,000 queued tokens: a second of queue there,
    # against the 0.8 s b needs to prefill the whole prompt.
    zones = _zones(queued_a=previous)
    # The previous turn was sent before that summary: the queue it shows is that turn,
    # finished since (the client sent the next one after the answer).
    before = PlacementMemory()
    before.remember(PROMPT, "a", NOW - 0.5, tokens=previous)
    recall = before.recall(PROMPT, NOW)
    assert sticky_zone(recall, zones[1], zones, request, tokens_per_block=PER_BLOCK) is zones[0]
    # Sent after that summary: the queue it shows is someone else's.
    after = PlacementMemory()
    after.remember(PROMPT, "a", NOW + 0.5, tokens=previous)
    recall = after.recall(PROMPT, NOW + 1.0)
    assert sticky_zone(recall, zones[1], zones, request, tokens_per_block=PER_BLOCK) is zones[1]


def test_a_zone_the_request_failed_on_is_not_recalled() -> None:
    memory = PlacementMemory()
    memory.remember(PROMPT, "a", NOW)
    zones = _zones()
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    recall = memory.recall(PROMPT, NOW)
    got = sticky_zone(
        recall, zones[1], zones, request, tokens_per_block=PER_BLOCK, excluded=frozenset({"a"})
    )
    assert got is zones[1]


def test_a_request_the_fair_queue_placed_stays_and_is_remembered() -> None:
    memory = ZoneMemory()
    zones = _zones()
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    memory.memory.remember(PROMPT, "a", NOW - 1.0)
    placed = memory.place(
        zones[1], request, lambda: zones, tokens_per_block=PER_BLOCK, now=NOW, movable=False
    )
    assert placed is zones[1]
    recall = memory.memory.recall(PROMPT, NOW)
    assert recall is not None
    assert recall.target == "b"


def test_a_warm_request_the_split_draws_for_a_peer_stays_and_a_cold_one_goes() -> None:
    memory = ZoneMemory()
    zones = _zones()
    request = route_request(tokens=TOKENS, prefix=PROMPT)

    def keep(local: ZoneState | None) -> ZoneState | None:
        return memory.keep_local(
            request, lambda: local, lambda: zones, tokens_per_block=PER_BLOCK, now=NOW
        )

    assert keep(zones[1]) is None  # nothing of it here: it spills
    memory.memory.remember(PROMPT, "a", NOW - 1.0)
    assert keep(zones[1]) is zones[0]
    assert keep(None) is None  # no zone here can take anything now
    full = _zones(running_a=40)
    assert (
        memory.keep_local(
            request, lambda: full[1], lambda: full, tokens_per_block=PER_BLOCK, now=NOW
        )
        is None
    )


def test_the_previous_turn_gives_its_fast_gpu_back_to_the_home_zone() -> None:
    # Each zone: one fast GPU beside three slow ones. A's summary, taken while the
    # previous turn prefilled on its fast GPU, shows that GPU busy; the turn is over,
    # so a is priced by that GPU (which holds the prefix), not by its average GPU
    # against b's idle fast one.
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    fast = GpuClassLoad(
        gpu_class="H100", healthy_gpus=1, prefill_tokens_per_s=20_000.0, free_gpus=1
    )
    slow = GpuClassLoad(gpu_class="L4", healthy_gpus=3, prefill_tokens_per_s=15_000.0, free_gpus=3)
    busy = fast.model_copy(update={"free_gpus": 0, "queued_prefill_tokens": TOKENS})

    def load(*classes: GpuClassLoad) -> ModelLoad:
        queued = sum(c.queued_prefill_tokens for c in classes)
        base = model_load(gpus=4, rate=35_000.0, queued=queued)
        return base.model_copy(update={"classes": classes})

    zones = zone_candidates(view([zone("a", load(busy, slow)), zone("b", load(fast, slow))]), "m")
    memory = PlacementMemory()
    memory.remember(PROMPT[:4], "a", NOW - 0.5, tokens=TOKENS)  # half the new prompt
    recall = memory.recall(PROMPT, NOW)
    assert sticky_zone(recall, zones[1], zones, request, tokens_per_block=PER_BLOCK) is zones[0]


def _kv_zones(*, running_a: int = 0, kv_free_b: int = 1000) -> tuple[ZoneState, ...]:
    """Zone a's KV cache 90 % used (past the saturation detector's 80 %): full by it
    alone, or by its request count too with ``running_a`` past its limit."""
    regional = view(
        [
            zone("a", model_load(running=running_a, kv=(1000, 100))),
            zone("b", model_load(kv=(1000, kv_free_b))),
        ]
    )
    return zone_candidates(regional, "m")


def test_a_home_full_only_by_its_kv_cache_use_keeps_its_conversation() -> None:
    # The prefix's blocks are resident at a and counted in its KV use; b would allocate
    # and prefill the whole prompt again.
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    memory = PlacementMemory()
    memory.remember(PROMPT, "a", NOW - 1.0)
    recall = memory.recall(PROMPT, NOW)
    zones = _kv_zones()
    assert zones[0].saturated
    assert zones[0].kv_bound
    assert can_hold(zones[0])
    assert sticky_zone(recall, zones[1], zones, request, tokens_per_block=PER_BLOCK) is zones[0]
    # Full by its request count as well: it holds nothing.
    crowded = _kv_zones(running_a=40)
    assert crowded[0].saturated
    assert not crowded[0].kv_bound
    assert not can_hold(crowded[0])
    got = sticky_zone(recall, crowded[1], crowded, request, tokens_per_block=PER_BLOCK)
    assert got is crowded[1]
    # Its queue is still priced: one far longer than the prefill the cache saves loses.
    regional = view(
        [zone("a", model_load(queued=200_000, kv=(1000, 100))), zone("b", model_load())]
    )
    queued = zone_candidates(regional, "m")
    assert queued[0].kv_bound
    assert sticky_zone(recall, queued[1], queued, request, tokens_per_block=PER_BLOCK) is queued[1]


def test_when_no_zone_can_take_a_request_its_home_holds_it_if_only_kv_fills_it() -> None:
    memory = ZoneMemory()
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    zones = _kv_zones(kv_free_b=100)  # both zones full by KV use
    assert all(z.saturated for z in zones)
    assert memory.hold(request, zones, now=NOW) is None  # nothing of it here
    memory.memory.remember(PROMPT, "b", NOW - 1.0)
    assert memory.hold(request, zones, now=NOW) is zones[1]
    memory.memory.remember(PROMPT, "a", NOW - 0.5)
    assert memory.hold(request, _kv_zones(running_a=40, kv_free_b=100), now=NOW) is None
    drained = zone_candidates(
        view(
            [
                zone("a", model_load(kv=(1000, 100)), drained=True),
                zone("b", model_load(kv=(1000, 100))),
            ]
        ),
        "m",
    )
    assert memory.hold(request, drained, now=NOW) is None


def test_the_router_keeps_a_request_no_zone_can_take_on_its_kv_full_home() -> None:
    router = RegionalRouter(build(profile_spec(None)), saturation_filter="saturation")
    inputs = Inputs(
        allowed=frozenset({"r1"}),
        on_saturation=SaturationPolicy.SPILL_WITHIN_ALLOWED,
        client_country_known=True,
        tokens_per_block=PER_BLOCK,
    )
    regional = view([zone("a", model_load(kv=(1000, 100))), zone("b", model_load(kv=(1000, 100)))])
    request = route_request(tokens=TOKENS, prefix=PROMPT)
    memory = ZoneMemory()

    def decide(keeper: ZoneMemory | None) -> RegionalDecision:
        return router.decide(
            request, regional, inputs, accounting=None, now=NOW, now_wall=NOW, keeper=keeper
        )

    assert decide(None).route is Route.QUEUE  # every zone full
    assert decide(memory).route is Route.QUEUE  # nothing of it here
    memory.memory.remember(PROMPT, "b", NOW - 1.0)
    kept = decide(memory)
    assert kept.route is Route.LOCAL
    assert kept.zone is not None
    assert kept.zone.id == "b"


def test_a_whole_fingerprint_match_credits_the_previous_prompt_not_the_fingerprint() -> None:
    # The tiers fingerprint a prompt's leading blocks only: 8 blocks of 500 tokens here,
    # of a 20,000-token turn whose previous turn (18,000 tokens) went to a. a's queue
    # (2 s) is less than the 3.6 s of prefill the previous prompt saves, more than the
    # 0.8 s the fingerprint alone would.
    request = route_request(tokens=20_000, prefix=PROMPT)
    zones = _zones(queued_a=20_000)
    memory = PlacementMemory()
    memory.remember(PROMPT, "a", NOW + 0.5, tokens=18_000)  # after a's summary
    recall = memory.recall(PROMPT, NOW + 1.0)
    assert recall is not None
    assert recall.held_tokens(request.input_tokens, len(PROMPT), PER_BLOCK) == 18_000.0
    assert sticky_zone(recall, zones[1], zones, request, tokens_per_block=PER_BLOCK) is zones[0]
    # Only part of the fingerprint matched: the prompts part there, the blocks count.
    partial = PlacementMemory()
    partial.remember(PROMPT[:4], "a", NOW + 0.5, tokens=18_000)
    recall = partial.recall(PROMPT, NOW + 1.0)
    assert recall is not None
    assert recall.held_tokens(request.input_tokens, len(PROMPT), PER_BLOCK) == 2_000.0
    assert sticky_zone(recall, zones[1], zones, request, tokens_per_block=PER_BLOCK) is zones[1]

"""The zone agent keeps a conversation on the GPU its prefix was just sent to."""

from __future__ import annotations

from zone_agent.accounting import Accounting, Ticket
from zone_agent.affinity import keeps_affinity, sticky_gpu
from zone_agent.profiles import builtin_profile
from zone_agent.router import ZoneDecision

from .helpers import Gpu, make_request, make_view

#: A conversation's history: long enough that a cache hit saves most of its prefill.
HISTORY = " ".join(f"word{k}" for k in range(3000))
TOKENS = 3000
GPUS = [Gpu("g0"), Gpu("g1"), Gpu("g2")]


def _send(acc: Accounting, decision: ZoneDecision) -> None:
    """Charge a decision as the agent does, and let it finish (first byte, then end)."""
    ticket = _dispatch(acc, decision)
    ticket.prefill_done()
    ticket.close()


def _dispatch(acc: Accounting, decision: ZoneDecision) -> Ticket:
    """Charge a decision as the agent does when it sends it."""
    return acc.start(
        decision.gpu_id,
        prefill_tokens=decision.uncached_tokens,
        prefix_hashes=decision.request.prefix_hashes,
        prefix_capacity=100_000,
    )


def _busy(acc: Accounting, gpu_id: str, streams: int) -> None:
    """Other conversations decoding on ``gpu_id`` (prefilled, still streaming)."""
    for _ in range(streams):
        acc.start(gpu_id, prefill_tokens=0.0, kv_blocks=64.0).prefill_done()


def _turns(acc: Accounting, streams_on_home: int) -> tuple[str, ZoneDecision, ZoneDecision]:
    """The first turn's GPU, then the profile's and the edge's decisions for the second,
    sent right after the first ended with ``streams_on_home`` other streams there."""
    profile = builtin_profile("default")
    first = sticky_gpu(
        profile.decide(make_request(tokens=TOKENS, text=HISTORY), make_view(GPUS, acc))
    )
    _send(acc, first)
    _busy(acc, first.gpu_id, streams_on_home)
    again = make_request(tokens=TOKENS, text=HISTORY, request_id="req-2")
    decided = profile.decide(again, make_view(GPUS, acc))
    return first.gpu_id, decided, sticky_gpu(decided)


def test_a_repeat_right_after_dispatch_goes_back_to_the_same_gpu() -> None:
    acc = Accounting()
    home, decided, kept = _turns(acc, streams_on_home=1)
    # One other stream there costs the GPU the profile's tight bounded-load credit, and
    # its KV room: the profile alone would prefill the whole prompt again elsewhere.
    assert decided.gpu_id != home
    assert kept.gpu_id == home
    assert kept.matched_blocks == len(make_request(text=HISTORY).prefix_hashes)
    assert kept.uncached_tokens < decided.uncached_tokens
    assert kept.predicted_ttft_ms is not None
    assert decided.predicted_ttft_ms is not None
    assert kept.predicted_ttft_ms < decided.predicted_ttft_ms
    assert kept.to_decision().choice == home  # the trace names where it went


def _carries_its_outcome(decision: ZoneDecision) -> None:
    """The fields the agent reads are those of the decision's outcome (copied out)."""
    outcome = decision.outcome
    batch, choice = outcome.batch, outcome.choice
    assert decision.choice == choice
    assert decision.gpu_id == outcome.choice_id == decision.gpu.id
    assert decision.predicted_ttft_ms == outcome.predicted_ttft_ms
    assert decision.request is batch.request
    assert decision.model_index is batch.index
    assert decision.profile == outcome.runner.name
    assert decision.uncached_tokens == batch.uncached_at(choice)
    assert decision.matched_blocks == batch.blocks_at(choice)


def test_a_decision_moved_or_not_carries_its_outcomes_choice() -> None:
    acc = Accounting()
    home, decided, kept = _turns(acc, streams_on_home=1)
    assert kept is not decided
    assert kept.gpu_id == home
    _carries_its_outcome(decided)
    _carries_its_outcome(kept)
    assert kept.matched_blocks > decided.matched_blocks


def test_after_eviction_the_repeat_is_a_new_prompt() -> None:
    acc = Accounting()
    profile = builtin_profile("default")
    first = profile.decide(make_request(tokens=TOKENS, text=HISTORY), make_view(GPUS, acc))
    _send(acc, first)
    _busy(acc, first.gpu_id, 1)
    acc.forget_prefixes([first.gpu_id])  # the GPU restarted: its cache is gone
    decided = profile.decide(make_request(tokens=TOKENS, text=HISTORY), make_view(GPUS, acc))
    assert sticky_gpu(decided) is decided
    assert decided.gpu_id != first.gpu_id


def test_affinity_yields_when_the_gpu_is_saturated() -> None:
    acc = Accounting()
    home, decided, kept = _turns(acc, streams_on_home=8)
    assert decided.gpu_id != home
    assert kept is decided  # past twice its share of the zone's streams: it moves on


def test_the_built_in_baselines_run_as_published() -> None:
    assert keeps_affinity(builtin_profile("default"))
    assert keeps_affinity(builtin_profile("ttft-only"))
    assert not keeps_affinity(builtin_profile("llm-d-blend"))
    assert not keeps_affinity(builtin_profile("sglang-cache-aware"))


def _second_turn(acc: Accounting, home: str) -> tuple[ZoneDecision, ZoneDecision]:
    """The profile's and the edge's decisions for the conversation's next turn, with one
    other stream on ``home`` (which costs it the profile's own credit)."""
    _busy(acc, home, 1)
    again = make_request(tokens=TOKENS, text=HISTORY, request_id="req-2")
    decided = builtin_profile("default").decide(again, make_view(GPUS, acc))
    return decided, sticky_gpu(decided)


def _first_turn(acc: Accounting) -> Ticket:
    """The first turn, sent to the profile's GPU (its first byte not come yet)."""
    first = builtin_profile("default").decide(
        make_request(tokens=TOKENS, text=HISTORY), make_view(GPUS, acc)
    )
    return _dispatch(acc, first)


def test_a_gpu_that_never_answered_the_prefix_is_not_its_home() -> None:
    # A black hole: it takes the first turn and never sends a byte. The prefix index
    # remembers the blocks went there, but it never prefilled them.
    acc = Accounting()
    sent = _first_turn(acc)
    again = make_request(tokens=TOKENS, text=HISTORY, request_id="req-2")
    decided = builtin_profile("default").decide(again, make_view(GPUS, acc))
    assert decided.gpu_id != sent.gpu_id
    assert sticky_gpu(decided) is decided
    # Its deadline fires: the request ends without a first byte, its charge is gone and
    # the GPU looks idle (but for one other stream), yet it holds nothing for affinity.
    sent.close()
    decided, kept = _second_turn(acc, sent.gpu_id)
    assert decided.gpu_id != sent.gpu_id
    assert kept is decided


def test_a_gpu_silent_since_it_answered_is_no_home_until_it_answers_again() -> None:
    acc = Accounting()
    sent = _first_turn(acc)
    sent.prefill_done()
    sent.close()
    home = sent.gpu_id
    _busy(acc, home, 1)
    # It answered the conversation, then went silent: a later request's deadline fired.
    acc.start(home, prefill_tokens=100.0).close()
    again = make_request(tokens=TOKENS, text=HISTORY, request_id="req-2")
    decided = builtin_profile("default").decide(again, make_view(GPUS, acc))
    assert decided.gpu_id != home
    assert sticky_gpu(decided) is decided
    # It answers again (another request's first byte): its prefixes count again.
    answered = acc.start(home, prefill_tokens=0.0)
    answered.prefill_done()
    answered.close()
    decided = builtin_profile("default").decide(again, make_view(GPUS, acc))
    assert decided.gpu_id != home
    assert sticky_gpu(decided).gpu_id == home


def test_a_held_assignment_counts_as_answered() -> None:
    # /v1/assign: another data plane carries the bytes; the agent never sees the first.
    acc = Accounting()
    sent = _first_turn(acc)
    acc.hold(sent, until=0.0)
    acc.expire(1.0)
    decided, kept = _second_turn(acc, sent.gpu_id)
    assert decided.gpu_id != sent.gpu_id
    assert kept.gpu_id == sent.gpu_id

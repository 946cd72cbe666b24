"""The zone agent keeps a conversation on the GPU its prefix was just sent to."""

from __future__ import annotations

from zone_agent.accounting import Accounting
from zone_agent.affinity import keeps_affinity, sticky_gpu
from zone_agent.profiles import builtin_profile
from zone_agent.router import ZoneDecision

from .helpers import Gpu, make_request, make_view

#: A conversation's history: long enough that a cache hit saves most of its prefill.
HISTORY = " ".join(f"word{k}" for k in range(3000))
TOKENS = 3000
GPUS = [Gpu("g0"), Gpu("g1"), Gpu("g2")]


def _send(acc: Accounting, decision: ZoneDecision) -> None:
    """Charge a decision as the agent does, and let it finish."""
    request = decision.request
    acc.start(
        decision.gpu_id,
        prefill_tokens=decision.uncached_tokens,
        prefix_hashes=request.prefix_hashes,
        prefix_capacity=100_000,
    ).close()


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

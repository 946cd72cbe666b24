"""The live prefix-affinity benchmark's own arithmetic (bench/prefix_affinity_live.py):
a run's figures from its replies, and gtm's verdicts against the baselines."""

from __future__ import annotations

import math

import pytest

from bench.prefix_affinity import verdicts
from bench.prefix_affinity_live import (
    LiveFigures,
    kept,
    live_figures,
    outcome,
    ranges,
    session_of,
    workload,
)
from bench.sim_fidelity import Reply
from fleetsim.traces import Trace, TraceKind, TraceRequest


def ok(ttft: float, e2e: float, prompt: int = 1000, cached: int = 0) -> Reply:
    return Reply(True, 200, "", ttft, e2e, "us-east", "g1", prompt, cached)


def test_outcomes_are_served_refused_or_timed_out() -> None:
    assert outcome(ok(0.1, 1.0)) == "ok"
    assert outcome(Reply(False, 503, "http-503", None, 0.1, "", "", 0, 0)) == "refused"
    assert outcome(Reply(False, 0, "ServerTimeoutError", None, 30.0, "", "", 0, 0)) == "timed_out"
    assert outcome(Reply(False, 0, "cancelled", None, 0.0, "", "", 0, 0)) == "timed_out"
    assert outcome(Reply(False, 200, "truncated-stream", 0.1, 1.0, "", "", 0, 0)) == "failed"


def test_figures_of_a_run() -> None:
    replies = [
        ok(0.5, 5.5, prompt=2000, cached=1000),  # within the SLO (TPOT 50 ms over 101)
        ok(3.0, 4.0, prompt=1000, cached=0),  # TTFT over 2 s: served, not good
        ok(0.2, 21.2, prompt=1000, cached=500),  # TPOT 210 ms: not good
        Reply(False, 429, "http-429", None, 0.0, "", "", 0, 0),
        Reply(False, 0, "cancelled", None, 0.0, "", "", 0, 0),
    ]
    figures = live_figures("gtm", replies, [101, 101, 101, 10, 10], window_s=10.0, speedup=1.0)
    assert figures.requests == 5
    # Cached ÷ prompt tokens over the served requests.
    assert figures.prefix_hit == pytest.approx(1500 / 4000)
    assert figures.goodput_rps == pytest.approx(1 / 10.0)
    assert (figures.refused, figures.timed_out, figures.failed) == (1, 1, 0)
    # The request that never answered is infinitely late; the refused one is left out.
    assert math.isinf(figures.ttft_p99)


def test_latencies_and_the_window_are_in_gpu_seconds() -> None:
    # GPUs twice as fast as real ones: 1.5 s of wall TTFT is 3 GPU s, over the SLO, and
    # 10 wall s of arrivals are 20 GPU s.
    replies = [ok(0.9, 0.91), ok(1.5, 1.51)]
    figures = live_figures("gtm", replies, [2, 2], window_s=10.0, speedup=2.0)
    assert figures.goodput_rps == pytest.approx(1 / 20.0)
    assert figures.ttft_p99 == pytest.approx(3.0)


def row(policy: str, hit: float, goodput: float) -> LiveFigures:
    return LiveFigures(policy, 100, hit, goodput, 1.0, 0, 0, 0)


def test_verdicts_read_live_figures() -> None:
    met = [
        row("gtm", 0.30, 5.0),
        row("gtm-no-affinity", 0.10, 4.0),
        row("llm-d-blend", 0.32, 5.0),
        row("sglang-cache-aware", 0.20, 4.5),
    ]
    lines, ok_ = verdicts(met)
    assert ok_
    assert any("prefix hit / best baseline's (llm-d-blend): 0.94" in line for line in lines)
    # gtm's hit share below 0.9 × the best baseline's, or its goodput below any
    # baseline's, misses.
    assert not verdicts([row("gtm", 0.28, 5.0), *met[1:]])[1]
    assert not verdicts([row("gtm", 0.30, 4.9), *met[1:]])[1]


def test_ranges_over_repetitions() -> None:
    runs = [[row("gtm", 0.30, 5.0)], [row("gtm", 0.25, 6.0)]]
    text = ranges(runs)
    assert "| gtm | 25.0%–30.0% | 5.00–6.00 | 1.00–1.00 |" in text


def conversations(n: int, turns: int, gap_s: float) -> Trace:
    """``n`` conversations of ``turns`` turns each, ``gap_s`` apart, one starting every
    second; every prompt shares block 0, a conversation's turns its second block on."""
    requests = [
        TraceRequest(c + t * gap_s, 512 * (t + 2), 10, (0, 1000 + c, *range(t + 1)))
        for c in range(n)
        for t in range(turns)
    ]
    requests.sort(key=lambda r: r.at_s)
    return Trace(TraceKind.MOONCAKE, "test", tuple(requests))


def test_a_conversation_is_its_second_block() -> None:
    trace = conversations(3, 2, 10.0)
    assert {session_of(r) for r in trace.requests} == {1000, 1001, 1002}
    alone = TraceRequest(0.0, 100, 10, (0,))
    assert session_of(alone) < 0


def test_kept_conversations_grow_with_the_fraction() -> None:
    sessions = range(10_000)
    some = {s for s in sessions if kept(s, 0.1)}
    more = {s for s in sessions if kept(s, 0.3)}
    assert some < more
    assert len(some) == pytest.approx(1000, rel=0.1)
    assert len(more) == pytest.approx(3000, rel=0.1)


def test_workload_keeps_whole_conversations_at_the_rate_asked() -> None:
    trace = conversations(4000, 3, 5.0)
    window, speed = workload(trace, rate_rps=2.0, duration_s=100.0, trace_speed=20.0)
    assert speed == 20.0
    # Every turn of a kept conversation that falls in the window is replayed.
    sessions = {session_of(r) for r in window}
    for r in trace.requests:
        if r.at_s < 100.0 * speed:
            assert (session_of(r) in sessions) == (r in window)
    assert len(window) / 100.0 == pytest.approx(2.0, rel=0.15)


def test_workload_runs_the_trace_faster_when_every_conversation_is_too_few() -> None:
    trace = conversations(100, 1, 1.0)  # one request/s
    window, speed = workload(trace, rate_rps=5.0, duration_s=10.0, trace_speed=2.0)
    assert speed == pytest.approx(5.0 / trace.rate_per_s)
    assert len(window) == 50

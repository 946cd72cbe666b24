"""The continuous-batching model, on virtual time (no clock at all: the test is the driver)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusim.engine import (
    DuplicateRequest,
    Engine,
    EngineConfig,
    EngineError,
    EngineRequest,
    EngineState,
    FinishedRequest,
    FinishReason,
    RequestTooLong,
    StepResult,
)
from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import LLAMA_8B, GpuProfile, get_profile
from gtm.tokens import block_hashes

NO_WARMUP = EngineConfig(degradation=Degradation(warmup_passes=0))


def profile(**overrides: Any) -> GpuProfile:
    return dataclasses.replace(get_profile("A100-80GB", LLAMA_8B), **overrides)


def run(engine: Engine, now: float = 0.0, limit: int = 10_000) -> tuple[list[StepResult], float]:
    """Step until idle; return the passes and the final engine time."""
    results: list[StepResult] = []
    for _ in range(limit):
        result = engine.step(now)
        if result is None:
            return results, now
        results.append(result)
        now = result.end
    raise AssertionError("engine did not go idle")


def finished(results: list[StepResult]) -> dict[str, FinishedRequest]:
    return {f.request_id: f for r in results for f in r.finished}


def test_admitted_requests_share_one_forward_pass() -> None:
    p = profile()
    engine = Engine(p, NO_WARMUP)
    for i in range(3):
        engine.add(EngineRequest(f"r{i}", 10, 3), now=0.0)
    first = engine.step(0.0)
    assert first is not None
    assert first.sequences == 3
    assert first.prefill_tokens == 30
    assert first.decode_tokens == 0
    assert [t.position for t in first.tokens] == [0, 0, 0]  # the prefill pass samples token 0
    assert first.duration == pytest.approx(
        p.forward_time_s(new_tokens=30, context_tokens=0, attention_pairs=3 * 55)
    )
    second = engine.step(first.end)
    assert second is not None
    assert second.decode_tokens == 3
    assert second.prefill_tokens == 0
    assert second.duration == pytest.approx(
        p.forward_time_s(new_tokens=3, context_tokens=30, attention_pairs=33)
    )
    assert second.inter_token_latencies == pytest.approx((second.duration,) * 3)
    results, _ = run(engine, second.end)
    done = finished([first, second, *results])
    assert {f.output_tokens for f in done.values()} == {3}
    assert all(f.reason is FinishReason.LENGTH for f in done.values())
    assert first.first_token_latencies == pytest.approx((first.duration,) * 3)


def test_step_never_starts_before_the_previous_pass_ends() -> None:
    engine = Engine(profile(), NO_WARMUP)
    engine.add(EngineRequest("a", 10, 5), 0.0)
    first = engine.step(0.0)
    assert first is not None
    second = engine.step(0.0)  # asked too early: starts when the GPU is free
    assert second is not None
    assert second.start == first.end
    assert engine.next_step_at(0.0) == second.end


def test_chunked_prefill_shares_the_token_budget_with_decode() -> None:
    engine = Engine(profile(max_num_batched_tokens=64), NO_WARMUP)
    engine.add(EngineRequest("short", 10, 6), 0.0)
    now = engine.step(0.0).end  # type: ignore[union-attr]
    engine.add(EngineRequest("long", 200, 1), now)
    chunks = []
    while "long" in engine:
        result = engine.step(now)
        assert result is not None
        now = result.end
        assert result.prefill_tokens + result.decode_tokens <= 64
        if "short" in {t.request_id for t in result.tokens}:
            assert result.decode_tokens == 1  # decode keeps going during the long prefill
        chunks.append(result.prefill_tokens)
    assert chunks == [63, 63, 63, 11]
    assert sum(chunks) == 200


def test_max_num_seqs_caps_the_batch() -> None:
    engine = Engine(profile(max_num_seqs=2), NO_WARMUP)
    for i in range(3):
        engine.add(EngineRequest(f"r{i}", 8, 4), 0.0)
    first = engine.step(0.0)
    assert first is not None
    assert first.sequences == 2
    stats = engine.stats(first.end)
    assert (stats.running, stats.waiting) == (2, 1)
    assert stats.pending_prefill_tokens == 8
    assert list(engine.waiting_ids()) == ["r2"]
    results, _ = run(engine, first.end)
    done = finished([first, *results])
    assert done["r2"].queue_time == pytest.approx(done["r0"].finished_at)


def test_admission_waits_for_kv_blocks() -> None:
    engine = Engine(profile(num_gpu_blocks=4, max_model_len=64), NO_WARMUP)
    engine.add(EngineRequest("a", 40, 10), 0.0)  # 3 blocks now, 4 at the end
    engine.add(EngineRequest("b", 20, 2), 0.0)  # 2 blocks: does not fit next to a
    first = engine.step(0.0)
    assert first is not None
    assert first.sequences == 1
    assert engine.stats().kv_blocks_free == 1
    results, _ = run(engine, first.end)
    done = finished([first, *results])
    assert done["b"].scheduled_at is not None
    assert done["b"].scheduled_at >= done["a"].finished_at
    assert done["a"].preemptions == done["b"].preemptions == 0


def test_kv_exhaustion_preempts_the_newest_sequence_by_recompute() -> None:
    engine = Engine(profile(num_gpu_blocks=6, max_model_len=96), NO_WARMUP)
    engine.add(EngineRequest("old", 30, 40), 0.0)
    engine.add(EngineRequest("new", 30, 40), 0.0)
    results, _ = run(engine)
    preempted = [rid for r in results for rid in r.preempted]
    assert preempted
    assert set(preempted) == {"new"}
    done = finished(results)
    assert done["old"].finished_at < done["new"].finished_at
    assert done["new"].preemptions == len(preempted)
    assert done["new"].output_tokens == done["old"].output_tokens == 40
    assert engine.stats().preemptions_total == len(preempted)
    # The recomputed prefill covers prompt + generated tokens, in one pass after "old" left.
    recompute = next(r for r in results if r.start >= done["old"].finished_at)
    assert recompute.prefill_tokens > 30
    tokens = [t.position for r in results for t in r.tokens if t.request_id == "new"]
    assert tokens == list(range(40))  # no token lost or repeated


def test_prefix_cache_hits_skip_prefill_and_count_tokens() -> None:
    engine = Engine(profile(), NO_WARMUP)
    hashes = block_hashes(list(range(4096)))
    engine.add(EngineRequest("cold", 4096, 2, hashes), 0.0)
    cold, now = run(engine)
    engine.add(EngineRequest("warm", 4096, 2, hashes), now)
    warm, now = run(engine, now)
    # All 256 blocks are cached, but the last prompt token is always recomputed: 255 hit.
    assert warm[0].prefill_tokens == 16
    assert finished(warm)["warm"].cached_tokens == 4080
    stats = engine.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (8192, 4080)
    ttft_cold = finished(cold)["cold"].ttft
    ttft_warm = finished(warm)["warm"].ttft
    assert ttft_cold is not None
    assert ttft_warm is not None
    assert ttft_warm < ttft_cold / 10  # 4,096 tokens of compute skipped
    # A prompt sharing only its first two blocks hits exactly those.
    other = block_hashes([*range(32), *range(10_000, 10_032)])
    engine.add(EngineRequest("half", 64, 1, other), now)
    half, _ = run(engine, now)
    assert finished(half)["half"].cached_tokens == 32


def test_lru_eviction_forgets_old_prefixes() -> None:
    engine = Engine(profile(num_gpu_blocks=4, max_model_len=64), NO_WARMUP)
    first = block_hashes(list(range(48)))
    engine.add(EngineRequest("first", 48, 1, first), 0.0)
    _, now = run(engine)
    assert engine.pool.num_cached == 3
    engine.add(EngineRequest("other", 48, 1, block_hashes(list(range(500, 548)))), now)
    _, now = run(engine, now)  # needs 3 of the 4 blocks: evicts the LRU ones
    engine.add(EngineRequest("again", 48, 1, first), now)
    again, _ = run(engine, now)
    assert finished(again)["again"].cached_tokens < 32
    assert engine.pool.evictions >= 2


def test_thermal_throttling_costs_a_fifth_of_throughput() -> None:
    normal, hot = Engine(profile(), NO_WARMUP), Engine(profile(), NO_WARMUP)
    hot.set_thermal_throttle(True)
    for engine in (normal, hot):
        engine.add(EngineRequest("r", 100, 10), 0.0)
    a, b = normal.step(0.0), hot.step(0.0)
    assert a is not None
    assert b is not None
    assert b.duration == pytest.approx(a.duration / 0.8)
    hot.set_thermal_throttle(False)
    c, d = normal.step(a.end), hot.step(b.end)
    assert c is not None
    assert d is not None
    assert d.duration == pytest.approx(c.duration)


def test_warmup_passes_start_twice_as_slow_and_recover_linearly() -> None:
    cold = Engine(profile(), EngineConfig(degradation=Degradation(warmup_passes=64)))
    warm = Engine(profile(), NO_WARMUP)
    for engine in (cold, warm):
        engine.add(EngineRequest("r", 16, 100), 0.0)
    ratios = []
    now_cold = now_warm = 0.0
    for _ in range(70):
        a, b = cold.step(now_cold), warm.step(now_warm)
        assert a is not None
        assert b is not None
        ratios.append(a.duration / b.duration)
        now_cold, now_warm = a.end, b.end
    assert ratios[0] == pytest.approx(2.0)
    assert ratios[32] == pytest.approx(1.5)
    assert ratios[64:] == pytest.approx([1.0] * 6)
    assert all(x >= y - 1e-9 for x, y in itertools.pairwise(ratios))


def test_cold_start_delays_serving_until_the_model_is_loaded() -> None:
    p = profile()
    engine = Engine(p, NO_WARMUP, loaded=False, now=0.0)
    assert engine.stats(0.0).state is EngineState.LOADING
    engine.add(EngineRequest("r", 10, 2), 0.0)
    assert engine.step(0.0) is None
    assert engine.next_step_at(0.0) == pytest.approx(p.cold_start_s)
    results, now = run(engine, p.cold_start_s)
    ttft = finished(results)["r"].ttft
    assert ttft is not None
    assert ttft > p.cold_start_s
    assert engine.stats(now).state is EngineState.READY
    # A reload preempts running work and starts a new cold start.
    engine.add(EngineRequest("s", 10, 50), now)
    step = engine.step(now)
    assert step is not None
    engine.load(step.end)
    assert engine.num_running == 0
    assert engine.num_waiting == 1
    assert engine.step(step.end) is None
    assert engine.ready_at == pytest.approx(step.end + p.cold_start_s)


def test_runs_are_deterministic_per_seed() -> None:
    def durations(seed: int) -> list[float]:
        engine = Engine(profile(), EngineConfig(step_jitter=0.1, seed=seed))
        for i in range(5):
            engine.add(EngineRequest(f"r{i}", 20 + i, 8), 0.0)
        results, _ = run(engine)
        return [r.duration for r in results]

    assert durations(7) == durations(7)
    assert durations(7) != durations(8)


def test_abort_frees_the_request_and_its_blocks() -> None:
    engine = Engine(profile(max_num_seqs=1), NO_WARMUP)
    engine.add(EngineRequest("running", 40, 100), 0.0)
    engine.add(EngineRequest("waiting", 40, 100), 0.0)
    step = engine.step(0.0)
    assert step is not None
    assert engine.stats().kv_blocks_free < engine.stats().kv_blocks_total
    gone = engine.abort("running", step.end)
    assert gone is not None
    assert gone.reason is FinishReason.ABORTED
    assert gone.output_tokens == 1
    assert engine.abort("waiting", step.end) is not None
    assert engine.abort("nobody", step.end) is None
    assert not engine.has_work
    assert engine.next_step_at(step.end) is None
    assert engine.stats().kv_blocks_free == engine.stats().kv_blocks_total


def test_prefill_only_requests_finish_without_tokens() -> None:
    engine = Engine(profile(), NO_WARMUP)
    engine.add(EngineRequest("embed", 300, 0), 0.0)
    results, _ = run(engine)
    assert len(results) == 1
    assert results[0].tokens == ()
    done = finished(results)["embed"]
    assert done.output_tokens == 0
    assert done.first_token_at is None
    assert done.ttft is None
    assert engine.stats().prompt_tokens_total == 300
    assert engine.stats().generation_tokens_total == 0


def test_bad_requests_are_refused() -> None:
    engine = Engine(profile(max_model_len=100))
    with pytest.raises(RequestTooLong, match="maximum context length is 100"):
        engine.add(EngineRequest("long", 90, 20), 0.0)
    engine.add(EngineRequest("ok", 90, 10), 0.0)
    with pytest.raises(DuplicateRequest):
        engine.add(EngineRequest("ok", 5, 1), 0.0)
    with pytest.raises(EngineError):
        EngineRequest("empty", 0, 1)
    with pytest.raises(EngineError):
        EngineRequest("negative", 1, -1)


def test_a_pass_never_includes_requests_that_arrived_after_it_started() -> None:
    engine = Engine(profile(), NO_WARMUP)
    engine.add(EngineRequest("early", 10, 3), 0.0)
    engine.add(EngineRequest("late", 10, 3), 1.0)
    first = engine.step(0.5)  # a driver running behind asks for a pass at 0.5
    assert first is not None
    assert [t.request_id for t in first.tokens] == ["early"]
    idle = Engine(profile(), NO_WARMUP)
    idle.add(EngineRequest("r", 10, 1), 2.0)
    result = idle.step(1.0)  # an idle GPU starts when the request arrives
    assert result is not None
    assert result.start == 2.0
    ttft = result.first_token_latencies[0]
    assert ttft == pytest.approx(result.duration)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(
        st.tuples(
            st.integers(1, 120),  # prompt tokens
            st.integers(0, 40),  # output tokens (0: prefill only)
            st.integers(0, 3),  # shared-prefix group
            st.floats(0.0, 0.5),  # arrival
        ),
        min_size=1,
        max_size=25,
    ),
    blocks=st.integers(11, 40),
    budget=st.integers(16, 256),
    seqs=st.integers(1, 8),
)
def test_every_request_finishes_exactly_once_with_all_its_tokens(
    requests: list[tuple[int, int, int, float]], blocks: int, budget: int, seqs: int
) -> None:
    engine = Engine(
        profile(
            num_gpu_blocks=blocks,
            max_model_len=160,
            max_num_batched_tokens=budget,
            max_num_seqs=seqs,
        ),
        NO_WARMUP,
    )
    expected: dict[str, int] = {}
    for i, (prompt, output, group, arrival) in enumerate(sorted(requests, key=lambda r: r[3])):
        tokens = [group * 1000 + t for t in range(prompt)]
        engine.add(EngineRequest(f"r{i}", prompt, output, block_hashes(tokens)), arrival)
        expected[f"r{i}"] = output
    results, _ = run(engine)
    positions: dict[str, list[int]] = {rid: [] for rid in expected}
    for result in results:
        for token in result.tokens:
            positions[token.request_id].append(token.position)
    done = finished(results)
    assert set(done) == set(expected)
    for rid, output in expected.items():
        assert positions[rid] == list(range(output))
        assert done[rid].output_tokens == output
        assert done[rid].reason is FinishReason.LENGTH
    stats = engine.stats()
    assert stats.kv_blocks_free == stats.kv_blocks_total  # nothing leaked
    assert stats.prefix_cache_hits <= stats.prefix_cache_queries
    assert all(r.end > r.start for r in results)
    assert all(b.start >= a.end for a, b in itertools.pairwise(results))

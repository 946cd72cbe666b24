"""The side-by-side benchmark's own logic (bench/router_side_by_side.py): arrivals sized
for a busy share, prompts that share real prefixes, gtm's verdicts against the best
peer; and bench/peers.py's command lines."""

from __future__ import annotations

import math
import os
import signal
import subprocess
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.peers import POLICIES, Peer, command
from bench.router_side_by_side import (
    POOLS,
    ROUTERS,
    Figures,
    Floor,
    Worker,
    arrivals,
    busy_rate,
    capacity_ttft_s,
    floor_ttft_s,
    max_context,
    parse_peer_events,
    prompt_text,
    reach,
    uncached_tokens,
    unloaded_e2e_s,
    verdicts,
    workload_floor,
    zone_args,
)
from fleetsim.traces import MOONCAKE_BLOCK_TOKENS, TraceKind, TraceRequest
from gtm.gpu_profiles import get_profile
from gtm.stats import percentile
from gtm.testing.processes import GtmProcess, cpu_seconds, descendants, tree, tree_cpu_seconds
from gtm.tokens import encode_text


def test_busy_rate_meets_its_share_and_grows_with_it() -> None:
    pool = POOLS["hetero"]
    rate = busy_rate(pool, 0.85, 8000, 300)
    lengths = [unloaded_e2e_s(g, 8000, 300) for g in pool]
    busy = sum(1 - math.exp(-rate / len(pool) * e) for e in lengths) / len(pool)
    assert busy == pytest.approx(0.85, abs=1e-6)
    assert busy_rate(pool, 0.5, 8000, 300) < rate
    # Slower GPUs hold a request longer: the same share is reached at a lower rate.
    assert busy_rate(("L4",) * 8, 0.85, 8000, 300) < busy_rate(("H100",) * 8, 0.85, 8000, 300)


def test_mooncake_prompts_share_their_common_blocks_and_azure_prompts_share_none() -> None:
    first = TraceRequest(0.0, 1024, 10, (7, 8))
    second = TraceRequest(1.0, 1500, 10, (7, 8, 9))
    a, b = encode_text(prompt_text(first, 0)), encode_text(prompt_text(second, 1))
    assert len(a) == 1024
    assert len(b) == 1500
    assert a == b[:1024]
    azure = TraceRequest(0.0, 600, 10)
    c, d = encode_text(prompt_text(azure, 0)), encode_text(prompt_text(azure, 1))
    assert len(c) == len(d) == 600
    assert c[:16] != d[:16]


def test_arrivals_fill_the_window_at_the_offered_rate() -> None:
    pool = ("H100", "L40S")
    work = arrivals(
        TraceKind.MOONCAKE, pool, busy=0.85, speedup=10, duration_s=20, max_wall_rate=25
    )
    assert work.plan[0].at_s == 0.0
    assert work.plan[-1].at_s == pytest.approx(20.0)
    assert len(work.plan) == pytest.approx(work.rate * work.speedup * 20, abs=1)
    assert all(a.input_tokens + a.output_tokens <= max_context(pool) for a in work.plan)
    # A rate the machine cannot send lowers the speedup, never below 1.
    capped = arrivals(
        TraceKind.MOONCAKE, pool, busy=0.85, speedup=10, duration_s=20, max_wall_rate=1
    )
    assert capped.speedup == pytest.approx(max(1.0, 1 / capped.rate))


def test_the_floor_is_the_uncached_prefill_on_the_fastest_gpu() -> None:
    pool = ("L4", "H100", "L40S")
    h100 = get_profile("H100", "meta-llama/Llama-3.1-8B-Instruct")
    first = TraceRequest(0.0, 3 * MOONCAKE_BLOCK_TOKENS, 10, (1, 2, 3))
    turn = TraceRequest(1.0, 4 * MOONCAKE_BLOCK_TOKENS + 100, 10, (1, 2, 3, 4, 5))
    other = TraceRequest(2.0, 2 * MOONCAKE_BLOCK_TOKENS, 10, (9, 2))  # 2 is not its prefix
    azure = TraceRequest(3.0, 1000, 10)
    floor = floor_ttft_s([first, turn, other, azure], pool)
    assert floor == [
        h100.prefill_time_s(3 * MOONCAKE_BLOCK_TOKENS),
        h100.prefill_time_s(MOONCAKE_BLOCK_TOKENS + 100),  # its first 3 blocks were sent
        h100.prefill_time_s(2 * MOONCAKE_BLOCK_TOKENS),
        h100.prefill_time_s(1000),
    ]
    # The fastest GPU is the floor's: every other one prefills slower.
    for gpu in ("L4", "L40S"):
        assert get_profile(gpu, "meta-llama/Llama-3.1-8B-Instruct").prefill_time_s(1000) > floor[3]
    # A whole prompt already cached still prefills one token.
    assert floor_ttft_s([first, first], pool)[1] == h100.prefill_time_s(1)


def test_reach_is_the_floors_p99_and_the_requests_within_the_slo_per_second() -> None:
    floor = [0.1] * 97 + [2.5, 3.0, 4.0]  # three prefills alone are over the 2 s TTFT
    p99, ceiling = reach(Floor(tuple(floor)), 50.0)
    assert 3.0 <= p99 <= 4.0
    assert ceiling == pytest.approx(97 / 50.0)
    # The pool's capacity, when it binds harder, is the p99 no router can beat.
    assert reach(Floor(tuple(floor), capacity_p99_s=7.5), 50.0) == (7.5, ceiling)
    assert reach(Floor(tuple(floor), capacity_p99_s=1.0), 50.0)[0] == p99
    nan = reach(Floor(), 50.0)
    assert math.isnan(nan[0])
    assert math.isnan(nan[1])


def test_capacity_bound_of_a_burst_leaves_out_the_largest_one_percent() -> None:
    # 200 prompts at once: the p99 may leave 2 late, so 198 must prefill first.
    at = [0.0] * 200
    assert capacity_ttft_s(at, [1000] * 200, 10_000.0) == pytest.approx(198 * 0.1)
    # The two left out are the largest ones.
    tokens = [1000] * 198 + [50_000, 80_000]
    assert capacity_ttft_s(at, tokens, 10_000.0) == pytest.approx(198 * 0.1)
    # Spread out so that each is done before the next arrives: capacity never binds
    # (a prompt's own prefill is floor_ttft_s's part).
    spaced = [i * 0.2 for i in range(200)]
    assert capacity_ttft_s(spaced, [1000] * 200, 10_000.0) == 0.0
    assert math.isnan(capacity_ttft_s([], [], 10_000.0))


def _fcfs_ttft(at: list[float], work: list[float]) -> list[float]:
    """One fluid server, first come first served (Lindley's recursion)."""
    done, out = 0.0, []
    for a, w in zip(at, work, strict=True):
        done = max(done, a) + w
        out.append(done - a)
    return out


def _shortest_first_ttft(at: list[float], work: list[float]) -> list[float]:
    """One fluid server, shortest waiting prompt first, without preemption."""
    out = [0.0] * len(at)
    waiting: list[int] = []
    now, i = 0.0, 0
    while i < len(at) or waiting:
        if not waiting:
            now = max(now, at[i])
        while i < len(at) and at[i] <= now:
            waiting.append(i)
            i += 1
        j = min(waiting, key=lambda k: (work[k], k))
        waiting.remove(j)
        now += work[j]
        out[j] = now - at[j]
    return out


@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.integers(1, 40_000)), min_size=1, max_size=150))
def test_capacity_bound_is_under_every_schedule_of_the_pool(
    requests: list[tuple[float, int]],
) -> None:
    at = sorted(a for a, _ in requests)
    tokens = [t for _, t in requests]
    rate = 20_000.0
    work = [t / rate for t in tokens]
    bound = capacity_ttft_s(at, tokens, rate)
    # A lower bound: no schedule of the fluid pool (so none of the real one) does better.
    for schedule in (_fcfs_ttft, _shortest_first_ttft):
        assert bound <= percentile(schedule(at, work), 0.99) + 1e-9
    # With no request left out, first come first served is the best there is, and the
    # bound is its worst TTFT exactly (Lindley's recursion, unrolled).
    assert capacity_ttft_s(at, tokens, rate, q=1.0) == pytest.approx(max(_fcfs_ttft(at, work)))


def test_a_workloads_floor_counts_only_the_uncached_tokens_at_the_pools_rate() -> None:
    pool = ("H100", "L4")
    rate = sum(
        get_profile(g, "meta-llama/Llama-3.1-8B-Instruct").prefill_tokens_per_s for g in pool
    )
    first = TraceRequest(0.0, 3 * MOONCAKE_BLOCK_TOKENS, 10, (1, 2, 3))
    again = TraceRequest(0.0, 3 * MOONCAKE_BLOCK_TOKENS, 10, (1, 2, 3))
    assert uncached_tokens([first, again]) == [3 * MOONCAKE_BLOCK_TOKENS, 1]
    floor = workload_floor([first, again], pool, [0.0, 0.0])
    assert floor.ttft_s == tuple(floor_ttft_s([first, again], pool))
    # Both at once: the p99 of two leaves none out, so both prefill first.
    assert floor.capacity_p99_s == pytest.approx((3 * MOONCAKE_BLOCK_TOKENS + 1) / rate)


def _figures(
    router: str,
    p99: float,
    goodput: float,
    rep: int = 0,
    *,
    floor: float = math.nan,
    ceiling: float = math.nan,
) -> Figures:
    return Figures(
        router=router, pool="hetero", trace="mooncake", repetition=rep, requests=100,
        success=1.0, ttft_p50_s=0.2, ttft_p99_s=p99, ttft_p99_served_s=p99, e2e_p50_s=5.0,
        goodput_rps=goodput, prefix_hit=0.3, per_gpu=(50, 50), router_cpu_s=1.0,
        floor_ttft_p99_s=floor, goodput_ceiling_rps=ceiling,
    )  # fmt: skip


def test_verdicts_compare_gtm_with_the_best_peer_of_each_repetition() -> None:
    rows = [
        _figures("gtm-default", 0.5, 2.5),
        _figures("gtm-round-robin", 0.1, 9.0),  # gtm's own baselines are not peers
        _figures("sglang-cache_aware", 1.2, 2.0),
        _figures("vllm-round_robin", 1.0, 1.5),
    ]
    lines, met = verdicts(rows)
    assert met
    assert "vllm-round_robin) = 0.50" in lines[0]
    assert "sglang-cache_aware) = 1.25" in lines[0]
    rows.append(_figures("vllm-kv_aware", 0.9, 2.2))
    lines, met = verdicts(rows)
    assert not met
    assert "MISSED" in lines[0]
    # A peer whose p99 timed out (∞) is beaten by any finite p99.
    timed_out = [_figures("gtm-default", 30.0, 3.0), _figures("vllm-round_robin", math.inf, 1.0)]
    lines, met = verdicts(timed_out)
    assert met
    assert "= 0.00" in lines[0]
    assert "reach" not in lines[0]
    assert "of the ceiling" not in lines[0]  # none known


def test_every_gtm_router_gets_a_verdict_and_the_chosen_one_decides() -> None:
    rows = [
        _figures("gtm-goodput", 3.0, 4.0),
        _figures("gtm-default", 0.5, 2.5),
        _figures("sglang-cache_aware", 1.2, 2.0),
    ]
    lines, met = verdicts(rows)
    assert [line.split(":")[0] for line in lines] == [
        "repetition 1, gtm-default",  # ours first
        "repetition 1, gtm-goodput",
    ]
    assert met
    lines, met = verdicts(rows, "gtm-goodput")
    assert not met  # its p99 is 2.5× the peer's
    assert lines[0].startswith("repetition 1, gtm-goodput")  # the chosen one first


def test_verdicts_say_when_no_router_could_meet_a_target() -> None:
    # The best peer's p99 is 1.5× the floor and its goodput 0.9 of the ceiling:
    # half that p99, and 1.2× that goodput, are beyond any router.
    rows = [
        _figures("gtm-default", 0.7, 2.7, floor=0.6, ceiling=3.0),
        _figures("sglang-cache_aware", 0.9, 2.7, floor=0.6, ceiling=3.0),
    ]
    lines, met = verdicts(rows)
    assert not met  # still missed: the verdict does not excuse it, it says why
    assert (
        "MISSED; out of any router's reach: 0.5 × the best peer's p99 is under the floor, 600 ms"
        in lines[0]
    )
    assert "over the ceiling, 3.00 req/s" in lines[0]
    assert lines[0].endswith("of the ceiling: gtm 90%, best peer 90%)")
    reachable = [
        _figures("gtm-default", 0.7, 2.7, floor=0.2, ceiling=4.0),
        _figures("sglang-cache_aware", 0.9, 2.7, floor=0.2, ceiling=4.0),
    ]
    assert "reach" not in verdicts(reachable)[0][0]


def test_peer_command_lines_name_the_policy_ports_and_workers() -> None:
    args = command(
        Peer.VLLM, "round_robin", ["http://127.0.0.1:1", "http://127.0.0.1:2"],
        host="127.0.0.1", port=9000, prometheus_port=9001,
    )  # fmt: skip
    assert args[1:3] == ["-m", "vllm_router.launch_router"]
    assert args[args.index("--worker-urls") + 1 : args.index("--policy")] == [
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
    ]
    assert args[args.index("--policy") + 1] == "round_robin"
    assert args[args.index("--prometheus-port") + 1] == "9001"
    assert POLICIES[Peer.SGLANG][0] == "cache_aware"  # each peer's default comes first
    with pytest.raises(ValueError, match="no policy 'kv_aware'"):
        command(Peer.SGLANG, "kv_aware", [], host="127.0.0.1", port=1, prometheus_port=2)


def _worker(port: int, kv_port: int | None) -> Worker:
    process = GtmProcess(proc=cast(Any, None), url=f"http://127.0.0.1:{port}")
    return Worker(process, f"tcp://127.0.0.1:{kv_port}" if kv_port else "")


def test_gtm_kv_events_names_each_workers_publisher_as_gtm_up_registers_it() -> None:
    specs = {r.name: r for r in ROUTERS}
    assert [r.name for r in ROUTERS if r.kv_events] == ["gtm-kv-events", "vllm-kv_aware"]
    pool = ("H100", "L4")
    args = zone_args(specs["gtm-kv-events"], [_worker(1, 5001), _worker(2, 5002)], pool)
    workers = [args[i + 1] for i, a in enumerate(args) if a == "--worker"]
    assert workers == [
        "http://127.0.0.1:1,gpu=H100,id=gpu-0,label:kv-events=tcp://127.0.0.1:5001",
        "http://127.0.0.1:2,gpu=L4,id=gpu-1,label:kv-events=tcp://127.0.0.1:5002",
    ]
    assert "--kv-events" in args
    plain = zone_args(specs["gtm-default"], [_worker(1, None), _worker(2, None)], pool)
    assert "--kv-events" not in plain
    assert not any("kv-events" in a for a in plain)
    assert "--profile" not in plain
    round_robin = zone_args(specs["gtm-round-robin"], [_worker(1, None), _worker(2, None)], pool)
    assert round_robin[round_robin.index("--profile") + 1] == "round-robin"
    assert "--admission" not in plain


def test_gtm_admission_runs_the_default_profile_under_flow_control() -> None:
    from zone_agent.cli import zone as zone_command

    specs = {r.name: r for r in ROUTERS}
    args = zone_args(specs["gtm-admission"], [_worker(1, None)], ("H100",))
    assert args[args.index("--admission") + 1] == "slo"
    assert "--profile" not in args
    # Every option it passes is one `gtm zone` has.
    names = {opt for param in zone_command.params for opt in getattr(param, "opts", ())}
    assert {a for a in args if a.startswith("--")} <= names


def test_peer_events_count_vllm_routers_renders_and_prefix_decisions() -> None:
    # vllm-router 0.1.17's own exposition after requests whose renders partly timed out.
    inputs = "vllm_router_kv_routing_inputs_total"
    decisions = "vllm_router_prefix_routing_decisions_total"
    by = 'policy="cache_aware",stage="regular"'
    text = "\n".join(
        [
            f"# TYPE {inputs} counter",
            f'{inputs}{{transport="http",result="render"}} 14',
            f'{inputs}{{transport="http",result="preparation_unavailable"}} 2074',
            f"# TYPE {decisions} counter",
            f'{decisions}{{{by},outcome="missing_tokens"}} 260',
            f'{decisions}{{{by},outcome="prefix_miss"}} 1',
            "# TYPE vllm_router_policy_decisions_total counter",
            'vllm_router_policy_decisions_total{policy="cache_aware",worker="http://w:1"} 261',
            "",
        ]
    )
    assert parse_peer_events(text) == {
        "inputs[render]": 14,
        "inputs[preparation_unavailable]": 2074,
        "decisions[missing_tokens]": 260,
        "decisions[prefix_miss]": 1,
    }
    assert parse_peer_events("") == {}


def test_descendants_finds_a_workers_child_processes() -> None:
    # A shell that starts a child and says its pid: the child is there once we read it.
    with subprocess.Popen(
        ["bash", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True
    ) as shell:
        assert shell.stdout is not None
        child = int(shell.stdout.readline())
        try:
            assert child in descendants(shell.pid)
            assert tree(shell.pid) == [shell.pid, *descendants(shell.pid)]
            assert tree_cpu_seconds(shell.pid) >= cpu_seconds(shell.pid)
            assert descendants(child) == []
        finally:
            os.kill(child, signal.SIGKILL)
            shell.kill()

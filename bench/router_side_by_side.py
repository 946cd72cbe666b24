"""Side by side with the routers operators run: gtm's zone agent, sglang-router and
vllm-router in front of the same emulated workers, on the same arrivals (issue 26, item 4).

    python bench/router_side_by_side.py                   # every pool × trace × router, once
    python bench/router_side_by_side.py --repeat 3        # three repetitions, order rotated
    python bench/router_side_by_side.py --pools hetero --traces mooncake --repeat 3
    python bench/router_side_by_side.py --routers gtm-default,vllm-round_robin
    python bench/router_side_by_side.py --smoke           # seconds: 2 GPUs, one policy each
    python bench/router_side_by_side.py --report reports/router-side-by-side
    python bench/router_side_by_side.py --one-worker   # each router before one idle
        worker: the TTFT it adds, and whether a client going away cancels upstream

**Workers.** Each run starts its own ``gtm gpu-sim`` processes (Llama-3.1-8B,
``--speedup`` × faster than the real GPU, 10 by default), so every router meets cold
workers with empty prefix caches, then stops them (SIGTERM stops a run cleanly too: its
workers and router are stopped, and ``--report`` gets the runs that ended). Pools:
``hetero`` (3 × H100, 2 × A100-80GB, 2 × L40S, 1 × L4) and ``h100`` (8 × H100). The
workers answer what each peer polls (:mod:`gpusim.peer_api`: SGLang's ``/get_load``,
``/server_info``, ``/model_info``; vLLM's ``/v1/completions/render`` and
``/kv_event_sources``), and for vllm-router's ``kv_aware`` and ``gtm-kv-events`` they
publish vLLM's KV events (``--kv-events-config``), so each policy has what it would have
in front of real engines.

**Routers.** ``gtm-default`` (``gtm zone`` with its default profile and settings),
``gtm-kv-events`` (the same agent subscribed to the workers' KV events, ``--kv-events``
with each worker's publisher as its ``kv-events`` label, as ``gtm up --kv-events``
wires them: what each GPU cached and evicted corrects its prefix placement),
``gtm-goodput`` (``--profile goodput``: when every GPU is late because of its queue,
the request goes where the lateness already is, so the rest drain and meet the SLO),
``gtm-admission`` (the default profile under the zone's flow control, ``--admission
slo``: a request waits in the agent while no GPU can take it with a short queue and
without breaking the TPOT of the requests decoding there, shortest first),
``gtm-round-robin`` (the same agent, ``--profile round-robin``), and the peers with
their own defaults, started by :mod:`bench.peers` (a missing peer fails the run; it
is never skipped): sglang-router ``cache_aware`` (its default), ``power_of_two``,
``round_robin``; vllm-router ``cache_aware`` (its default), ``kv_aware``,
``round_robin``. Within a repetition every router runs once per pool and trace; the
order rotates by one each repetition, so a slow spell of the shared machine does not
always fall on the same router.

**Arrivals.** A contiguous slice of the trace (Mooncake conversation, Azure
conversation, Azure code; requests whose prompt and output do not fit the pool's
smallest context are left out), its inter-arrival times scaled so that the mean GPU
of the pool has work ``--busy`` of the time (0.85, :mod:`fleetsim`'s "GPU busy"; the
rate comes from each GPU's unloaded E2E of the slice's mean request,
:func:`busy_rate`). That is well under the pools' saturated capacity (the run prints
the ratio, fleetsim's "load"): decode-bound work keeps a GPU busy with few requests.
The emulated GPUs run ``--speedup`` × faster than real ones (10), lowered (not below 1)
so that at most ``--max-wall-rate`` requests/s (25) reach the router: a shared 2-core
machine runs the workers, the router and the client. Mooncake prompts are built from
the trace's ``hash_ids`` (one deterministic 512-token text per id, as
``bench/zone_quality.py`` does), so turns of a conversation share real prefixes; Azure
prompts are unique texts of the trace's lengths. Every request is an open-loop
streaming ``/v1/completions`` with ``max_tokens`` = the trace's output length and
``ignore_eos``, sent by a client with no connection limit (the figures are the
router's, not the client's); a request with no byte for the simulator's client
timeout gives up.

**Figures**, in GPU time (wall × speedup), per router: success ratio (an HTTP 200
whose stream ended with ``[DONE]``); TTFT p50 and p99 over successful requests; E2E
p50; goodput: requests/s within :mod:`fleetsim.metrics`' SLO (TTFT ≤ 2 s and TPOT ≤
100 ms) over the arrival window; prefix-hit share (cached ÷ prompt tokens, from the
workers' usage); requests per GPU and each worker's own mean TTFT (its queue and
prefill, no router); the router process's CPU seconds; the workers' CPU seconds
(their renderer processes included) and the worst worker's event-loop lag p99 (an
emulated GPU whose loop lags runs behind its profile: the run was bound by this
machine); what the router's own metrics say it did (gtm: retries, ejections, KV events
applied; vllm-router: how it got each worker's token ids and its prefix decisions).
The report explains why vllm-router's prefix policies are slow here
(:data:`EMULATION_NOTE`). With ``--repeat`` each figure is printed as its range over
repetitions, and gtm's ratios against the best peer against the issue's targets: p99
TTFT ≤ 0.5 × the best peer's and goodput ≥ 1.2 × the best peer's, on every pool ×
trace. Each workload also gets what no router can beat (:func:`reach`): the floor's p99
TTFT (each request's prefill alone, :func:`floor_ttft_s`, or the pool's prefill
capacity under the burst, :func:`capacity_ttft_s`, whichever is higher) and the goodput
ceiling, a row of its table; a verdict whose target lies beyond them says so, and stays
MISSED.

Wall-clock figures on a shared 2-core machine carry its load: 8 worker processes, the
router and the client share two cores. Read ranges, not single runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Run as a script, sys.path starts at bench/, not at the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import (
    POLICIES,
    Peer,
    PeerRouter,
    require,
    start_peer,
    version,
)
from bench.zone_quality import block_text  # one 512-token text per Mooncake block id
from fleetsim.metrics import SLO_TPOT_S, SLO_TTFT_S
from fleetsim.simulator import CLIENT_TIMEOUT_S
from fleetsim.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceKind, TraceRequest, load_trace
from fleetsim.workload import fleet_capacity_rps
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.kv_events import KV_EVENTS_LABEL
from gtm.metrics import new_registry
from gtm.net import free_port
from gtm.stats import percentile, rank
from gtm.tasks import TaskSupervisor
from gtm.testing.processes import GtmProcess, cpu_seconds, start_listening, tree_cpu_seconds
from zone_agent.config import DEFAULT_KV_EVENTS

MODEL = LLAMA_8B
POOLS: dict[str, tuple[str, ...]] = {
    "hetero": ("H100", "H100", "H100", "A100-80GB", "A100-80GB", "L40S", "L40S", "L4"),
    "h100": ("H100",) * 8,
}
SMOKE_POOL = ("H100", "L40S")
TRACES = (TraceKind.MOONCAKE, TraceKind.AZURE_CONV, TraceKind.AZURE_CODE)
#: The issue's targets: gtm's p99 TTFT at most this × the best peer's ...
P99_TARGET = 0.5
#: ... and its goodput at least this × the best peer's.
GOODPUT_TARGET = 1.2
#: Wall seconds a run may drain after its last arrival before what is left is cut.
DRAIN_WALL_S = 60.0


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """One contestant: gtm's zone agent with a profile, or a peer with a policy."""

    name: str
    gtm_profile: str | None = None
    peer: Peer | None = None
    policy: str = ""
    #: The workers publish vLLM's KV events and the router reads them (``gtm zone
    #: --kv-events``; vllm-router's ``kv_aware``).
    kv_events: bool = False
    #: More of ``gtm zone``'s options (gtm only).
    gtm_args: tuple[str, ...] = ()

    @property
    def is_gtm(self) -> bool:
        return self.gtm_profile is not None


def _peer(peer: Peer, policy: str) -> RouterSpec:
    short = "sglang" if peer is Peer.SGLANG else "vllm"
    return RouterSpec(f"{short}-{policy}", peer=peer, policy=policy, kv_events=policy == "kv_aware")


ROUTERS: tuple[RouterSpec, ...] = (
    RouterSpec("gtm-default", gtm_profile="default"),
    RouterSpec("gtm-goodput", gtm_profile="goodput"),
    RouterSpec("gtm-admission", gtm_profile="default", gtm_args=("--admission", "slo")),
    RouterSpec("gtm-kv-events", gtm_profile="default", kv_events=True),
    RouterSpec("gtm-round-robin", gtm_profile="round-robin"),
    _peer(Peer.SGLANG, "cache_aware"),
    _peer(Peer.SGLANG, "power_of_two"),
    _peer(Peer.SGLANG, "round_robin"),
    _peer(Peer.VLLM, "cache_aware"),
    _peer(Peer.VLLM, "kv_aware"),
    _peer(Peer.VLLM, "round_robin"),
)
#: --smoke: gtm's default, with KV events, and one policy (the default) of each peer.
SMOKE_ROUTERS = ("gtm-default", "gtm-kv-events", "sglang-cache_aware", "vllm-cache_aware")
OURS = "gtm-default"


# ---------------------------------------------------------------------------- workload


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request to send: when (wall s after the start), its prompt and output size."""

    at_s: float
    prompt: str
    input_tokens: int
    output_tokens: int


def prompt_text(request: TraceRequest, unique: int) -> str:
    """The prompt of ``request``: its Mooncake blocks, or (no hashes: Azure) blocks of
    its own, numbered from ``unique`` so that no two requests share a prefix."""
    blocks = request.prefix_hashes or tuple(
        -(unique * 1000 + k) - 1
        for k in range(math.ceil(request.input_tokens / MOONCAKE_BLOCK_TOKENS))
    )
    parts: list[str] = []
    remaining = request.input_tokens
    for block in blocks:
        take = min(MOONCAKE_BLOCK_TOKENS, remaining)
        parts.extend(block_text(block)[:take])
        remaining -= take
    return "".join(parts)


def max_context(pool: Sequence[str]) -> int:
    """The longest prompt + output every GPU of ``pool`` holds."""
    return min(get_profile(gpu, MODEL).max_model_len for gpu in pool)


def unloaded_e2e_s(gpu: str, input_tokens: float, output_tokens: float) -> float:
    """The mean request's E2E alone on ``gpu``: its prefill, then one decode step per
    output token at batch 1 (GPU seconds)."""
    profile = get_profile(gpu, MODEL)
    step = profile.decode_step_s(1, input_tokens + output_tokens / 2)
    return profile.prefill_time_s(round(input_tokens)) + output_tokens * step


def busy_rate(pool: Sequence[str], busy: float, input_tokens: float, output_tokens: float) -> float:
    """Requests per GPU second at which the mean GPU of ``pool`` has work ``busy`` of the
    time (:mod:`fleetsim`'s "GPU busy"), requests spread evenly: a GPU offered λ/G
    requests/s of unloaded length E is idle with probability exp(-λE/G) (M/G/∞)."""
    lengths = [unloaded_e2e_s(g, input_tokens, output_tokens) for g in pool]

    def mean_busy(rate: float) -> float:
        return statistics.fmean(1 - math.exp(-rate / len(pool) * e) for e in lengths)

    lo, hi = 0.0, 1.0
    while mean_busy(hi) < busy:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_busy(mid) < busy else (lo, mid)
    return (lo + hi) / 2


def uncached_tokens(window: Sequence[TraceRequest]) -> list[int]:
    """Each request's prompt tokens no router can find cached: every block an earlier
    request of the slice sent counts as cached (Mooncake; Azure prompts share nothing),
    whatever GPU it went to and in whatever order its blocks were seen; at least one
    token is computed."""
    seen: set[int] = set()
    out = []
    for r in window:
        cached = 0
        for block in r.prefix_hashes:
            if block not in seen:
                break
            cached += 1
        seen.update(r.prefix_hashes)
        out.append(max(1, r.input_tokens - cached * MOONCAKE_BLOCK_TOKENS))
    return out


def floor_ttft_s(window: Sequence[TraceRequest], pool: Sequence[str]) -> list[float]:
    """Each request's TTFT with no router in the way, GPU seconds: its prefill alone on
    the pool's fastest GPU, idle, with its :func:`uncached_tokens` only. No router can
    beat it: a request's TTFT is at least its uncached prefill on some GPU. This floor is
    lower still: a cached prefix's attention is not counted."""
    return prefill_alone_s(uncached_tokens(window), pool)


def prefill_alone_s(tokens: Sequence[int], pool: Sequence[str]) -> list[float]:
    """Each prompt's prefill of ``tokens`` alone on the fastest GPU of ``pool``, s."""
    profiles = [get_profile(gpu, MODEL) for gpu in sorted(set(pool))]
    return [min(p.prefill_time_s(u) for p in profiles) for u in tokens]


def capacity_ttft_s(
    at_s: Sequence[float], tokens: Sequence[int], tokens_per_s: float, q: float = 0.99
) -> float:
    """The least ``q``-percentile TTFT (nearest rank, GPU seconds) any router can give
    requests arriving at ``at_s`` (GPU seconds, ascending) with ``tokens`` to prefill,
    on GPUs that prefill ``tokens_per_s`` together at most: the pool's capacity, where
    :func:`floor_ttft_s` is one request's.

    A relaxation, so a lower bound: the pool is one fluid server (a prompt may be split
    across GPUs, a GPU never idles while work waits) that only prefills (decode steps
    cost nothing) at the sum of the GPUs' compute-bound rates (no step overhead, no
    attention: :meth:`gtm.gpu_profiles.GpuProfile.forward_time_s` never goes faster).
    A p99 of T leaves at most k = n − ⌈0.99 n⌉ requests later than T. The requests
    arriving in any interval [a, b] must then have prefilled, all but at most k of
    them, by b + T, having started no earlier than a: their tokens less their k
    largest are at most ``tokens_per_s`` × (b − a + T). The bound is the largest T any
    interval needs (0 when capacity never binds)."""
    n = len(at_s)
    if n == 0:
        return math.nan
    k = n - (rank(n, q) + 1)
    need = 0.0
    for a in range(n):
        largest: list[float] = []  # the interval's k largest prefills (a min-heap)
        total = dropped = 0.0
        for b in range(a, n):
            work = tokens[b] / tokens_per_s
            total += work
            if len(largest) < k:
                heapq.heappush(largest, work)
                dropped += work
            elif k and work > largest[0]:
                dropped += work - heapq.heappushpop(largest, work)
            need = max(need, total - dropped - (at_s[b] - at_s[a]))
    return need


@dataclass(frozen=True, slots=True)
class Floor:
    """What no router can beat on a workload, GPU seconds: each request's
    :func:`floor_ttft_s`, and the pool's :func:`capacity_ttft_s` at p99."""

    ttft_s: tuple[float, ...] = ()
    capacity_p99_s: float = 0.0


def workload_floor(
    window: Sequence[TraceRequest], pool: Sequence[str], at_s: Sequence[float]
) -> Floor:
    """The :class:`Floor` of ``window`` replayed on ``pool`` at ``at_s`` (GPU s)."""
    rate = sum(get_profile(gpu, MODEL).prefill_tokens_per_s for gpu in pool)
    tokens = uncached_tokens(window)
    return Floor(tuple(prefill_alone_s(tokens, pool)), capacity_ttft_s(at_s, tokens, rate))


def window_gpu_s(plan: Sequence[Arrival], speedup: float) -> float:
    """The arrival window in GPU seconds (goodput's denominator)."""
    return max(1e-9, plan[-1].at_s * speedup) if plan else 1.0


def reach(floor: Floor, window_s: float) -> tuple[float, float]:
    """What no router can beat on a workload with the :class:`Floor` ``floor`` over
    ``window_s`` GPU seconds: the p99 TTFT (its requests' floors' p99 or the pool's
    capacity bound, whichever is higher), and the goodput ceiling (the requests whose
    floor is within the SLO's TTFT, per GPU second; the TPOT part of the SLO is far
    above one decode step); NaN without floors."""
    if not floor.ttft_s:
        return math.nan, math.nan
    within = sum(t <= SLO_TTFT_S for t in floor.ttft_s)
    p99 = max(percentile(sorted(floor.ttft_s), 0.99), floor.capacity_p99_s)
    return p99, within / window_s


@dataclass(frozen=True, slots=True)
class Workload:
    plan: list[Arrival]
    #: Offered requests per GPU second, and the speedup the run uses (GPU s per wall s).
    rate: float
    speedup: float
    #: The offered rate ÷ the pool's saturated capacity (fleetsim's "load").
    load: float
    #: What no router can beat (per arrival and the pool's capacity), GPU s.
    floor: Floor


def arrivals(
    kind: TraceKind, pool: Sequence[str], *, busy: float, speedup: float, duration_s: float,
    max_wall_rate: float, offset: int = 0,
) -> Workload:  # fmt: skip
    """The requests to replay over ``duration_s`` wall seconds so that the pool is
    ``busy`` (:func:`busy_rate`, on the slice's own mean sizes). The speedup is lowered
    (not below 1) when ``speedup`` × that rate would exceed ``max_wall_rate`` requests
    per wall second, more than one shared machine can send and route."""
    trace = load_trace(kind)
    limit = max_context(pool)
    kept = [r for r in trace.requests if r.input_tokens + r.output_tokens <= limit]
    window = kept[offset : offset + 200]
    for _ in range(4):  # the slice's sizes set the rate, the rate sets the slice
        mean_in = statistics.fmean(r.input_tokens for r in window)
        mean_out = statistics.fmean(max(1, r.output_tokens) for r in window)
        rate = busy_rate(pool, busy, mean_in, mean_out)
        used = max(1.0, min(speedup, max_wall_rate / rate))
        count = max(2, round(rate * used * duration_s))
        window = kept[offset : offset + count]
    span = window[-1].at_s - window[0].at_s
    scale = duration_s / span if span > 0 else 0.0  # wall s per trace s
    plan = [
        Arrival(
            (r.at_s - window[0].at_s) * scale,
            prompt_text(r, offset + k),
            r.input_tokens,
            max(1, r.output_tokens),
        )
        for k, r in enumerate(window)
    ]
    sliced = Trace(kind, trace.source, tuple(window))
    capacity = fleet_capacity_rps(list(pool), MODEL, sliced, max_input=limit)
    floor = workload_floor(window, pool, [a.at_s * used for a in plan])
    return Workload(plan, rate, used, rate / capacity, floor)


# ---------------------------------------------------------------------------- client


@dataclass(frozen=True, slots=True)
class Reply:
    ok: bool
    status: int
    reason: str
    ttft_s: float | None
    e2e_s: float
    tokens: int
    prompt_tokens: int
    cached_tokens: int


async def send(session: aiohttp.ClientSession, url: str, a: Arrival) -> Reply:
    body = {
        "model": MODEL,
        "prompt": a.prompt,
        "max_tokens": a.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft: float | None = None
    tokens = prompt_tokens = cached = 0
    done = False
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                await response.read()
                return Reply(False, response.status, f"http {response.status}", None,
                             time.perf_counter() - start, 0, 0, 0)  # fmt: skip
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    tokens += 1
                usage = chunk.get("usage")
                if usage:
                    prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    cached = int(details.get("cached_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Reply(False, 0, type(exc).__name__, ttft, time.perf_counter() - start,
                     tokens, prompt_tokens, cached)  # fmt: skip
    elapsed = time.perf_counter() - start
    ok = done and ttft is not None
    return Reply(ok, 200, "" if ok else "incomplete stream", ttft, elapsed, tokens,
                 prompt_tokens, cached)  # fmt: skip


async def replay(url: str, plan: Sequence[Arrival], speedup: float) -> list[Reply]:
    """Open loop: each request at its time; a request with no byte for the simulator's
    client timeout (in GPU time) gives up; whatever is unfinished
    :data:`DRAIN_WALL_S` after the last arrival is cut."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=CLIENT_TIMEOUT_S / speedup)
    connector = aiohttp.TCPConnector(limit=0)  # no client-side queueing
    replies: list[Reply | None] = [None] * len(plan)
    supervisor = TaskSupervisor(registry=new_registry(), component="router-side-by-side")
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(k: int) -> None:
            replies[k] = await send(session, url, plan[k])

        start = time.monotonic()
        tasks = []
        for k, a in enumerate(plan):
            delay = start + a.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(supervisor.spawn(f"request-{k}", one(k)))
        if tasks:
            await asyncio.wait(tasks, timeout=DRAIN_WALL_S)
        await supervisor.aclose()  # what is left is cut
    return [
        r if r is not None else Reply(False, 0, "cut at drain end", None, 0.0, 0, 0, 0)
        for r in replies
    ]


# ---------------------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class Figures:
    router: str
    pool: str
    trace: str
    repetition: int
    requests: int
    success: float
    ttft_p50_s: float
    #: Over every request not refused, a request that never got a first token = ∞.
    ttft_p99_s: float
    #: Over the successful requests only (what a table of served requests shows).
    ttft_p99_served_s: float
    e2e_p50_s: float
    goodput_rps: float
    prefix_hit: float
    per_gpu: tuple[int, ...]
    router_cpu_s: float
    failures: dict[str, int] = field(default_factory=dict)
    #: Per GPU (pool order): requests aborted (the client or router gave up), and the
    #: worker's own mean TTFT in GPU seconds (its queue and prefill, no router).
    per_gpu_aborted: tuple[int, ...] = ()
    per_gpu_ttft_s: tuple[float, ...] = ()
    #: What the router's own metrics say it did: gtm's zone agent its retries (by
    #: reason), ejections and KV events applied; vllm-router how it got each worker's
    #: token ids (``render``, or a reason it has none) and its prefix decisions.
    router_events: dict[str, int] = field(default_factory=dict)
    #: The workers' CPU seconds during the run (all of them), and the worst worker's
    #: event-loop lag p99 (wall ms, ``/admin/lag``): an emulated GPU whose loop lags
    #: runs behind its profile, so a high lag marks a run bound by this machine's CPU,
    #: not by the routing (see :data:`EMULATION_NOTE`).
    worker_cpu_s: float = math.nan
    worker_lag_p99_ms: float = math.nan
    #: What no router can beat on this workload (the same for every router): the p99
    #: TTFT of :func:`reach` (each request's :func:`floor_ttft_s` or the pool's
    #: :func:`capacity_ttft_s`), and the most goodput there is: the requests
    #: whose floor is within the SLO's TTFT, over the window (a request whose prefill
    #: alone takes longer is late behind any router), both in GPU time. NaN in results
    #: saved before they were kept.
    floor_ttft_p99_s: float = math.nan
    goodput_ceiling_rps: float = math.nan


def figures(
    spec: RouterSpec, pool: str, trace: str, repetition: int, plan: Sequence[Arrival],
    replies: Sequence[Reply], speedup: float, tallies: Sequence[WorkerTally], cpu_s: float,
    floor: Floor = Floor(),
) -> Figures:  # fmt: skip
    ok = [r for r in replies if r.ok]
    ttft = sorted(r.ttft_s * speedup for r in ok if r.ttft_s is not None)
    e2e = sorted(r.e2e_s * speedup for r in ok)
    good = 0
    for a, r in zip(plan, replies, strict=True):
        if not r.ok or r.ttft_s is None:
            continue
        tpot = (r.e2e_s - r.ttft_s) * speedup / (a.output_tokens - 1) if a.output_tokens > 1 else 0
        good += r.ttft_s * speedup <= SLO_TTFT_S and tpot <= SLO_TPOT_S
    window = window_gpu_s(plan, speedup)
    floor_p99, ceiling = reach(floor, window)
    # fleetsim's convention: every request not refused counts, one that never got a
    # first token (timed out, cut) is infinitely late.
    late = sorted(
        r.ttft_s * speedup if r.ok and r.ttft_s is not None else math.inf
        for r in replies
        if not 400 <= r.status < 600
    )
    prompt = sum(r.prompt_tokens for r in ok)
    failures: dict[str, int] = {}
    for r in replies:
        if not r.ok:
            failures[r.reason] = failures.get(r.reason, 0) + 1
    return Figures(
        router=spec.name, pool=pool, trace=trace, repetition=repetition,
        requests=len(replies), success=len(ok) / max(1, len(replies)),
        ttft_p50_s=percentile(ttft, 0.5) if ttft else math.nan,
        ttft_p99_s=percentile(late, 0.99) if late else math.nan,
        ttft_p99_served_s=percentile(ttft, 0.99) if ttft else math.nan,
        e2e_p50_s=percentile(e2e, 0.5) if e2e else math.nan,
        goodput_rps=good / window,
        prefix_hit=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        per_gpu=tuple(t.served for t in tallies), router_cpu_s=cpu_s, failures=failures,
        per_gpu_aborted=tuple(t.aborted for t in tallies),
        per_gpu_ttft_s=tuple(round(t.ttft_mean_s, 3) for t in tallies),
        floor_ttft_p99_s=floor_p99, goodput_ceiling_rps=ceiling,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class WorkerTally:
    """What one worker says it did: requests finished (not aborted) and its own mean
    TTFT (engine time: queue + prefill, without any router or network)."""

    served: int
    aborted: int
    ttft_mean_s: float


async def worker_tallies(workers: Sequence[Worker]) -> list[WorkerTally]:
    """Each worker's :class:`WorkerTally`, from its ``/metrics`` (any flavour)."""
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for worker in workers:
            try:
                async with session.get(worker.url + "/metrics") as response:
                    text = await response.text()
            except (aiohttp.ClientError, TimeoutError):
                out.append(WorkerTally(-1, -1, math.nan))
                continue
            served = aborted = 0.0
            ttft_sum = ttft_count = 0.0
            for family in text_string_to_metric_families(text):
                if family.name.endswith("request_success"):
                    for sample in family.samples:
                        if not sample.name.endswith("_total"):
                            continue
                        if sample.labels.get("finished_reason") == "abort":
                            aborted += sample.value
                        else:
                            served += sample.value
                elif family.name.endswith("time_to_first_token_seconds"):
                    for sample in family.samples:
                        if sample.name.endswith("_sum"):
                            ttft_sum += sample.value
                        elif sample.name.endswith("_count"):
                            ttft_count += sample.value
            mean = ttft_sum / ttft_count if ttft_count else math.nan
            out.append(WorkerTally(int(served), int(aborted), mean))
    return out


async def worker_lag_p99_ms(workers: Sequence[Worker]) -> float:
    """The worst event-loop lag p99 (wall ms) over ``workers`` (gpu-sim's ``/admin/lag``,
    since each started: they are fresh for every run)."""
    worst = math.nan
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for worker in workers:
            try:
                async with session.get(worker.url + "/admin/lag") as response:
                    body = await response.json()
                lag = float(body["event_loop_lag"]["p99_ms"])
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
                continue
            worst = lag if math.isnan(worst) else max(worst, lag)
    return worst


def workers_cpu_s(workers: Sequence[Worker]) -> float:
    """CPU seconds the worker processes (with their renderer processes) have used so
    far, together."""
    return sum(tree_cpu_seconds(w.process.proc.pid) for w in workers)


#: vllm-router's counters (``src/metrics.rs`` of 0.1.17) that show what its prefix
#: policies had: how each worker's token ids for a request were got (``render``, or why
#: not: ``preparation_unavailable`` when the worker missed the 1 s budget, ...), its
#: prefix decisions (``prefix_hit``, ``prefix_miss``, ``load_imbalance``,
#: ``missing_tokens``) and kv_aware's index lookups. By family, then the label kept.
PEER_EVENTS = {
    "vllm_router_kv_routing_inputs": ("inputs", "result"),
    "vllm_router_prefix_routing_decisions": ("decisions", "outcome"),
    "vllm_router_kv_placement_lookups": ("kv_lookups", "result"),
}


async def peer_events(metrics_url: str) -> dict[str, int]:
    """:func:`parse_peer_events` of a peer's Prometheus exposition at ``metrics_url``."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(metrics_url) as response,
        ):
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    return parse_peer_events(text)


def parse_peer_events(text: str) -> dict[str, int]:
    """:data:`PEER_EVENTS` in a Prometheus exposition ``text``, summed per label value
    (``inputs[render]``, ``decisions[missing_tokens]``, ...)."""
    out: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in PEER_EVENTS:
            continue
        short, label = PEER_EVENTS[family.name]
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.value:
                key = f"{short}[{sample.labels.get(label, '')}]"
                out[key] = out.get(key, 0) + int(sample.value)
    return out


#: The zone agent's counters that show where it did not just forward: retries on
#: another GPU (by reason: first-byte deadline, 429, connect failure, ...) and ejections.
ZONE_EVENTS = ("gtm_zone_retries", "gtm_zone_ejections")
#: Its KV-event counters (``--kv-events``), summed over the GPUs: the events it applied
#: (the evidence that ``gtm-kv-events`` had the engines' picture) and what went wrong.
ZONE_KV_EVENTS = (
    "gtm_zone_kv_events_applied",
    "gtm_zone_kv_event_gaps",
    "gtm_zone_kv_event_decode_errors",
    "gtm_zone_kv_event_disconnects",
)


async def zone_events(url: str) -> dict[str, int]:
    """The zone agent's retries by reason, its ejections and its mean time before a
    request goes upstream (parse, count, decide), from its ``/metrics``."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(url + "/metrics") as response,
        ):
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    out: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "gtm_zone_request_overhead_seconds":
            total = sum(x.value for x in family.samples if x.name.endswith("_sum"))
            count = sum(x.value for x in family.samples if x.name.endswith("_count"))
            if count:  # wall µs in the agent before the request goes upstream
                out["decide_mean_us"] = round(1e6 * total / count)
        if family.name in ZONE_KV_EVENTS:
            total = sum(x.value for x in family.samples if x.name.endswith("_total"))
            if total:
                key = family.name.removeprefix("gtm_zone_")
                out[key] = out.get(key, 0) + int(total)
            continue
        if family.name not in ZONE_EVENTS:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.value:
                label = ",".join(f"{v}" for _, v in sorted(sample.labels.items()))
                key = family.name.removeprefix("gtm_zone_") + (f"[{label}]" if label else "")
                out[key] = out.get(key, 0) + int(sample.value)
    return out


@dataclass(frozen=True, slots=True)
class Worker:
    process: GtmProcess
    #: Where it publishes KV events (``tcp://127.0.0.1:PORT``), when it does.
    kv_endpoint: str = ""

    @property
    def url(self) -> str:
        return self.process.url


@contextlib.asynccontextmanager
async def worker_pool(
    pool: Sequence[str], speedup: float, *, kv_events: bool
) -> AsyncIterator[list[Worker]]:
    """Fresh ``gtm gpu-sim`` workers (empty caches), stopped on the way out; with
    ``kv_events`` each publishes vLLM's KV events on a loopback port of its own."""
    args, endpoints = [], []
    for i, gpu in enumerate(pool):
        one = ["gpu-sim", "--port", "0", "--gpu-type", gpu, "--speedup", f"{speedup:g}",
               "--warmup-passes", "0", "--seed", str(i), "--model", MODEL]  # fmt: skip
        endpoint = ""
        if kv_events:
            port = free_port("127.0.0.1")
            endpoint = f"tcp://127.0.0.1:{port}"
            # vllm-router 0.1.17 decodes map-encoded events only ("KV event must be a
            # tagged map" for the array form).
            config = {
                "enable_kv_cache_events": True,
                "endpoint": f"tcp://*:{port}",
                "encoding": "map",
            }
            one += ["--kv-events-config", json.dumps(config)]
        args.append(one)
        endpoints.append(endpoint)
    processes = await asyncio.gather(*(start_listening(a) for a in args))
    try:
        yield [Worker(p, e) for p, e in zip(processes, endpoints, strict=True)]
    finally:
        await asyncio.gather(*(p.stop() for p in processes))


def zone_args(spec: RouterSpec, workers: Sequence[Worker], pool: Sequence[str]) -> list[str]:
    """``gtm zone``'s command line for ``spec`` in front of ``workers`` (GPU types
    ``pool``); with KV events each worker's publisher is its ``kv-events`` label, as
    ``gtm up --kv-events`` registers it."""
    args = ["zone", "--zone", "bench-a", "--region", "bench", "--listen", "127.0.0.1:0"]
    if spec.gtm_profile != "default":
        args += ["--profile", str(spec.gtm_profile)]
    args += spec.gtm_args
    for i, (w, gpu) in enumerate(zip(workers, pool, strict=True)):
        label = f",label:{KV_EVENTS_LABEL}={w.kv_endpoint}" if w.kv_endpoint else ""
        args += ["--worker", f"{w.url},gpu={gpu},id=gpu-{i}{label}"]
    if spec.kv_events:
        args += ["--kv-events", DEFAULT_KV_EVENTS]  # each worker's label wins
    return args


@dataclass(frozen=True, slots=True)
class RunningRouter:
    """A router serving a run: its URL, its CPU seconds so far, and what its own
    metrics say it did (:func:`zone_events`, :func:`peer_events`)."""

    url: str
    cpu_seconds: Callable[[], float]
    events: Callable[[], Awaitable[dict[str, int]]]


@contextlib.asynccontextmanager
async def router(
    spec: RouterSpec, workers: Sequence[Worker], pool: Sequence[str]
) -> AsyncIterator[RunningRouter]:
    """The router in front of ``workers``, stopped on the way out."""
    if spec.is_gtm:
        agent = await start_listening(zone_args(spec, workers, pool))
        pid = agent.proc.pid
        try:
            yield RunningRouter(agent.url, lambda: cpu_seconds(pid), lambda: zone_events(agent.url))
        finally:
            await agent.stop()
        return
    assert spec.peer is not None
    # vllm-router's kv_aware: each worker's publisher named (its /kv_event_sources
    # discovery does not parse vLLM's answer in this release; see the report).
    extra = [
        arg
        for w in workers
        if w.kv_endpoint
        for arg in ("--kv-event-source", f"{w.url}={w.kv_endpoint}")
    ]
    if extra:
        extra += ["--kv-event-model", MODEL]
    peer: PeerRouter = await start_peer(
        spec.peer, spec.policy, [w.url for w in workers], extra_args=extra
    )
    try:
        yield RunningRouter(peer.url, peer.cpu_seconds, lambda: peer_events(peer.metrics_url))
    finally:
        await peer.stop()


async def run_one(
    spec: RouterSpec, pool_name: str, pool: Sequence[str], trace: TraceKind,
    plan: Sequence[Arrival], speedup: float, repetition: int, floor: Floor = Floor(),
) -> Figures:  # fmt: skip
    async with (
        worker_pool(pool, speedup, kv_events=spec.kv_events) as workers,
        router(spec, workers, pool) as running,
    ):
        started_cpu, started_workers = running.cpu_seconds(), workers_cpu_s(workers)
        replies = await replay(running.url, plan, speedup)
        cpu_s = running.cpu_seconds() - started_cpu
        worker_cpu = workers_cpu_s(workers) - started_workers
        tallies = await worker_tallies(workers)
        lag = await worker_lag_p99_ms(workers)
        events = await running.events()
    result = figures(
        spec, pool_name, trace.value, repetition, plan, replies, speedup, tallies, cpu_s, floor
    )
    return dataclasses.replace(
        result, router_events=events, worker_cpu_s=worker_cpu, worker_lag_p99_ms=lag
    )


# ---------------------------------------------------------------------------- output


def _ms(seconds: float) -> str:
    if math.isinf(seconds):
        return "timeout"
    return "–" if math.isnan(seconds) else f"{seconds * 1000:,.0f}"


def row(f: Figures) -> str:
    fails = ", ".join(f"{k} {n}" for k, n in sorted(f.failures.items())) or "-"
    if f.router_events:
        fails += "; " + ", ".join(f"{k} {n}" for k, n in sorted(f.router_events.items()))
    return (
        f"| {f.router} | {f.success:.1%} | {_ms(f.ttft_p50_s)} | {_ms(f.ttft_p99_s)} | "
        f"{_ms(f.ttft_p99_served_s)} | "
        f"{_ms(f.e2e_p50_s)} | {f.goodput_rps:.2f} | {f.prefix_hit:.0%} | "
        f"{' '.join(map(str, f.per_gpu))} | {' '.join(f'{t:.1f}' for t in f.per_gpu_ttft_s)} | "
        f"{f.router_cpu_s:.1f} | {_cpu(f.worker_cpu_s)}, {_lag(f.worker_lag_p99_ms)} | {fails} |"
    )


def _lag(ms: float) -> str:
    return "–" if math.isnan(ms) else f"{ms:,.0f}"


def _cpu(seconds: float) -> str:  # "–": results saved before the workers' CPU was kept
    return "–" if math.isnan(seconds) else f"{seconds:.1f}"


HEADER = (
    "| router | success | TTFT p50 ms | TTFT p99 ms | p99 served ms | E2E p50 ms | goodput req/s | "
    "prefix hit | requests per GPU | worker TTFT mean s per GPU | router CPU s | "
    "workers: CPU s, worst loop lag p99 ms | failures; router's events |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|"
)


def _span(values: Sequence[float], fmt: str) -> str:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "–"
    lo, hi = min(vals), max(vals)

    def shown(v: float) -> str:
        return "timeout" if math.isinf(v) else format(v, fmt)

    return shown(lo) if lo == hi else f"{shown(lo)}–{shown(hi)}"


def ranges(rows: Sequence[Figures], order: Sequence[str]) -> list[str]:
    """Per router, each figure's range over repetitions."""
    out = [
        "| router | runs | success | TTFT p50 ms | TTFT p99 ms | p99 served ms | E2E p50 ms "
        "| goodput req/s | prefix hit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in order:
        mine = [f for f in rows if f.router == name]
        if not mine:
            continue
        out.append(
            f"| {name} | {len(mine)} | {_span([f.success * 100 for f in mine], '.1f')} % | "
            f"{_span([f.ttft_p50_s * 1000 for f in mine], ',.0f')} | "
            f"{_span([f.ttft_p99_s * 1000 for f in mine], ',.0f')} | "
            f"{_span([f.ttft_p99_served_s * 1000 for f in mine], ',.0f')} | "
            f"{_span([f.e2e_p50_s * 1000 for f in mine], ',.0f')} | "
            f"{_span([f.goodput_rps for f in mine], '.2f')} | "
            f"{_span([f.prefix_hit * 100 for f in mine], '.0f')} % |"
        )
    floors = [f for f in rows if not math.isnan(f.floor_ttft_p99_s)]
    if floors:  # the same for every router of a workload
        out.append(
            f"| floor: no router can beat it | | | | {_ms(floors[0].floor_ttft_p99_s)} | | | "
            f"{floors[0].goodput_ceiling_rps:.2f} (ceiling) | |"
        )
    return out


def verdicts(rows: Sequence[Figures], ours_name: str = OURS) -> tuple[list[str], bool]:
    """Each gtm router's ratios against the best peer per repetition (best = lowest
    p99, highest goodput among the peers of that repetition), and whether ``ours_name``
    met every target."""
    lines = []
    met = True
    gtms = sorted(
        {f.router for f in rows if f.router.startswith("gtm-")},
        key=lambda name: (name != ours_name, name),  # ours first
    )
    for rep, name in itertools.product(sorted({f.repetition for f in rows}), gtms):
        mine = [f for f in rows if f.repetition == rep]
        ours = next((f for f in mine if f.router == name), None)
        peers = [f for f in mine if not f.router.startswith("gtm-")]
        if ours is None or not peers:
            continue
        p99s = [f.ttft_p99_s for f in peers if not math.isnan(f.ttft_p99_s)]
        best_p99 = min(p99s) if p99s else math.inf
        best_good = max(f.goodput_rps for f in peers)
        p99_ratio = ours.ttft_p99_s / best_p99 if best_p99 > 0 else math.inf
        good_ratio = ours.goodput_rps / best_good if best_good > 0 else math.inf
        ok_p99, ok_good = p99_ratio <= P99_TARGET, good_ratio >= GOODPUT_TARGET
        if name == ours_name:
            met &= ok_p99 and ok_good
        # Whether any router could: a p99 under the floor, or goodput over the
        # ceiling, is out of reach (Figures.floor_ttft_p99_s, goodput_ceiling_rps).
        p99_note = _out_of_reach(
            best_p99 * P99_TARGET < ours.floor_ttft_p99_s,
            f"{P99_TARGET} × the best peer's p99 is under the floor, "
            f"{ours.floor_ttft_p99_s * 1000:,.0f} ms",
        )
        good_note = _out_of_reach(
            best_good * GOODPUT_TARGET > ours.goodput_ceiling_rps,
            f"{GOODPUT_TARGET} × the best peer's goodput is over the ceiling, "
            f"{ours.goodput_ceiling_rps:.2f} req/s",
        )
        best_p99_name = next(f.router for f in peers if f.ttft_p99_s == best_p99) if p99s else "-"
        best_good_name = next(f.router for f in peers if f.goodput_rps == best_good)
        # Each router's goodput as a share of the ceiling: how much of what there was
        # to serve on time it served.
        share = ""
        if ours.goodput_ceiling_rps > 0:  # (False for NaN: results saved before it)
            share = (
                f"; of the ceiling: gtm {ours.goodput_rps / ours.goodput_ceiling_rps:.0%}, "
                f"best peer {best_good / ours.goodput_ceiling_rps:.0%}"
            )
        lines.append(
            f"repetition {rep + 1}, {name}: p99 TTFT gtm/best peer ({best_p99_name}) = "
            f"{p99_ratio:.2f} (target ≤ {P99_TARGET}: {'met' if ok_p99 else 'MISSED'}"
            f"{p99_note}); goodput gtm/best peer ({best_good_name}) = {good_ratio:.2f} "
            f"(target ≥ {GOODPUT_TARGET}: {'met' if ok_good else 'MISSED'}{good_note}{share})"
        )
    return lines, met


def _out_of_reach(out: bool, why: str) -> str:
    """A verdict's note when no router could meet the target on this workload."""
    return f"; out of any router's reach: {why}" if out else ""


def plot(rows: Sequence[Figures], order: Sequence[str], path: Path) -> str:
    """p99 TTFT and goodput per router for each pool × trace (ranges as error bars)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(plots need the `report` extra: pip install -e '.[report]')"
    combos = sorted({(f.pool, f.trace) for f in rows})
    fig, axes = plt.subplots(
        2, len(combos), figsize=(4.5 * len(combos), 7), squeeze=False, constrained_layout=True
    )
    for col, (pool, trace) in enumerate(combos):
        names = [n for n in order if any(f.router == n and f.pool == pool for f in rows)]
        for r, (attr, label) in enumerate(
            (("ttft_p99_s", "TTFT p99 (s, log)"), ("goodput_rps", "goodput (req/s)"))
        ):
            ax = axes[r][col]
            mids, los, his = [], [], []
            for n in names:
                vals = [
                    getattr(f, attr)
                    for f in rows
                    if f.router == n and f.pool == pool and f.trace == trace
                ]
                # A timed-out p99 is drawn at the client timeout.
                vals = [min(v, CLIENT_TIMEOUT_S) for v in vals if not math.isnan(v)] or [0.0]
                mid = statistics.median(vals)
                mids.append(mid)
                los.append(mid - min(vals))
                his.append(max(vals) - mid)
            colors = ["tab:green" if n.startswith("gtm-") else "tab:gray" for n in names]
            ax.bar(range(len(names)), mids, yerr=[los, his], color=colors, capsize=3)
            ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(label)
            if attr == "ttft_p99_s":
                ax.set_yscale("log")
                ax.set_title(f"{pool} · {trace}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![p99 TTFT and goodput per router]({path.name})"


#: What each peer policy reads from a worker, and whether the emulator gives it
#: (gpusim.peer_api; read from the peers' code and from what they asked a recording
#: worker). Printed into the report.
_PEER_INPUT_ROWS = (
    (
        "sglang-router · all",
        "`/health` (every 60 s); at join `/server_info`, `/model_info` (`/get_…` on a 404), "
        "for labels only (model path and name, tp/dp size; 0.3.2 "
        "`src/core/steps/worker/local/discover_metadata.rs`), and an HTTP/2 probe for "
        "gRPC workers",
        "answers all",
    ),
    (
        "sglang-router · cache_aware",
        "nothing more (0.3.2 `src/policies/cache_aware.rs` `select_worker`): its radix tree "
        "is of the texts it routed, its load its own in-flight count; `/get_load` is polled "
        "only while a power_of_two policy exists (`src/core/worker_manager.rs` "
        "`LoadMonitor`). Its defaults are kept: cache_threshold 0.3, balance 64 / 1.5, "
        "eviction every 60 s, 2^26 tree characters",
        "—",
    ),
    (
        "sglang-router · power_of_two",
        "`/get_load` every 30 s: the sum of `num_tokens` (SGLang's array)",
        "answers, from the engine",
    ),
    ("sglang-router · round_robin", "nothing more", "—"),
    ("vllm-router · all", "`/health` (every 60 s)", "answers"),
    (
        "vllm-router · cache_aware",
        "`POST /v1/completions/render` on *every* worker before each request (token ids "
        "for its tree), waiting at most 1 s; defaults kept: cache_threshold 0.3, balance "
        "64 / 1.5, eviction every 120 s",
        "answers with the engine's token ids, tokenized in a renderer process of the "
        "worker's own (as vLLM's API server) — but see the note below: here that is one "
        "tokenization per worker per request on one shared machine",
    ),
    (
        "vllm-router · kv_aware",
        "`/get_server_info` (block size), `/kv_event_sources`, then each worker's ZMQ "
        "KV-event stream; renders on every worker as above",
        "answers; 0.1.17's discovery does not parse vLLM's `/kv_event_sources` answer, "
        "so the bench names each publisher (`--kv-event-source`), map-encoded (the "
        "form 0.1.17 decodes)",
    ),
    (
        "vllm-router · power_of_two",
        "`/get_load` every 30 s, an object's `load` field (SGLang's old form; vLLM has "
        "no `/get_load`)",
        "answers SGLang's array: the policy uses its own in-flight counts, as in front of vLLM",
    ),
    ("vllm-router · round_robin", "nothing more", "—"),
)
PEER_INPUTS = "\n".join(
    [
        "| router · policy | reads from the workers | the emulator |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in _PEER_INPUT_ROWS),
    ]
)

#: Why vllm-router's prefix policies run slow here (issue 26 asked); each run's
#: "workers" column (CPU, worst event-loop lag) and its "router's events" (vllm-router's
#: own counters of renders and decisions) are the evidence.
EMULATION_NOTE = """\
**vllm-router's `cache_aware` and `kv_aware` here.** Before routing a request, both
policies ask *every* worker to tokenize its prompt — `POST /v1/completions/render` to
each worker, up to 8 at once, then wait for all of them or 1 s, whichever comes first
(vllm-router 0.1.17 `src/backend/preprocess.rs` `prepare_http_token_inputs`, lines
179-283; the 1 s budget is `src/routers/http/router.rs` line 1581; needed whenever the
policy matches prefixes, line 1546). No option turns this off for text prompts sent to
HTTP workers (a prompt of token ids skips it: preprocess.rs lines 113-119), and it
loads no tokenizer of its own for them (`src/backend/frontend.rs` line 292). In a real
deployment each render runs on that worker's own host, in vLLM's API-server process,
beside the GPU, in a few milliseconds. Here all the emulated workers share two cores
with the client and the router, at `--speedup` × the real request rate: every request
costs N + 1 tokenizations of a prompt of thousands of tokens instead of one, and every
millisecond vllm-router waits for them counts `--speedup` × in the GPU-time figures.
gpu-sim renders in a process of its own (`gpusim.render`, as vLLM's API server does),
so the emulated GPU's loop is not held by it, but the CPU is shared: the workers' CPU
(the "workers" column, renderer processes included) grows by one tokenization per
worker per request, renders queue, and a worker whose render misses the 1 s budget
leaves the policy without its tokens. vllm-router has then waited the whole second and
falls back to the least-loaded worker (`decisions[missing_tokens]`,
`inputs[preparation_unavailable]` in its events; 0.1.17 `src/policies/cache_aware.rs`
`select_prepared`, line 356). A row where those counters are high measures this
machine's CPU, not vllm-router's routing; a row where `inputs[render]` is the requests
× the workers had every render in time. A lower wall rate (`--max-wall-rate`: a lower
speedup; the figures are in GPU time and stay comparable) lowers the render load in
proportion. sglang-router's `cache_aware` keeps its radix tree of request texts inside
the router and asks the workers nothing per request; gtm tokenizes once, in the zone
agent.
"""

#: Why gtm's round-robin is ahead of the peers' round-robin on a mixed pool (issue 26
#: asked); the per-GPU columns of each run are the evidence.
ROUND_ROBIN_NOTE = """\
**gtm round-robin vs the peers' round-robin.** gtm's `round-robin` profile is the
round-robin picker behind gtm's zone filters, not blind rotation: the fits filter drops
a GPU whose free KV blocks (last scrape minus what the agent sent since) cannot hold
the request whenever another can, and the data path retries a streamed request on
another GPU when its first byte misses the deadline and ejects GPUs that time out. On
the mixed pool the L4 (the slowest GPU, with the smallest KV cache) therefore gets
fewer requests than its rotation share, and its queue stays bounded. sglang-router's
and vllm-router's `round_robin` rotate blindly: every GPU gets the same count (see
"requests per GPU"), the L4 cannot keep up with its share of long Mooncake prompts,
its own queue grows for the whole run (see its worker TTFT) and the pool's p99 is that
queue. With one worker at low load the three add the same few ms to TTFT, all three
cancel the worker's request when the client goes away, and the client has no
connection limit: the gap is the decision, not the proxies or the load generator. On
the all-H100 pool rotation is fair and the three round-robins meet.
"""


def write_report(
    directory: Path, rows: Sequence[Figures], order: Sequence[str], header: str
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(
        json.dumps([asdict(f) for f in rows], indent=1), "utf-8"
    )
    lines = ["# Router side by side", "", header, "", "## What each peer reads", ""]
    lines += [PEER_INPUTS, "", EMULATION_NOTE, "", ROUND_ROBIN_NOTE, ""]
    for pool, trace in sorted({(f.pool, f.trace) for f in rows}):
        mine = [f for f in rows if f.pool == pool and f.trace == trace]
        lines += [f"## {pool} · {trace}", "", *ranges(mine, order), ""]
        lines += [f"- {v}" for v in verdicts(mine)[0]] + [""]
        lines += ["Every run:", "", HEADER, *(row(f) for f in mine), ""]
    lines.append(plot(rows, order, directory / "side_by_side.png"))
    path = directory / "README.md"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


# ---------------------------------------------------------------------------- one worker


#: Prompt sizes of --one-worker's TTFT samples, tokens: short, and a Mooncake-long one
#: (a router that tokenizes or hashes the prompt pays for its length).
ONE_WORKER_PROMPTS = (150, 12_000)


async def _first_token_s(session: aiohttp.ClientSession, url: str, tokens: int) -> float:
    prompt = prompt_text(TraceRequest(0.0, tokens, 4), tokens)  # a prefix of its own
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4,
            "stream": True, "ignore_eos": True}  # fmt: skip
    start = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: {"):
                break
    return time.perf_counter() - start


async def _running(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "vllm:num_requests_running"
            for sample in family.samples
        )
    )


async def one_worker(specs: Sequence[RouterSpec], samples: int = 15) -> None:
    """Each router in front of one idle H100 worker (real speed): the TTFT of requests
    sent one at a time (:data:`ONE_WORKER_PROMPTS`), direct and through it (what the
    proxy adds; the worker's prefix cache is warm after the first of each), and
    whether a client that goes away mid-stream has its request cancelled on the
    worker (six long streams opened, then closed)."""
    print("one worker (H100, speedup 1), one request at a time:")
    for spec in [None, *specs]:
        async with (
            worker_pool(("H100",), 1.0, kv_events=spec is not None and spec.kv_events) as workers,
            contextlib.AsyncExitStack() as stack,
            aiohttp.ClientSession() as session,
        ):
            url = workers[0].url
            if spec is not None:
                running = await stack.enter_async_context(router(spec, workers, ("H100",)))
                url = running.url
            ttfts = []
            for tokens in ONE_WORKER_PROMPTS:
                await _first_token_s(session, url, tokens)  # warm connections and cache
                ttfts.append(
                    sorted([await _first_token_s(session, url, tokens) for _ in range(samples)])
                )
            streams = []
            long_body = {"model": MODEL, "prompt": "a b c", "max_tokens": 3000,
                         "stream": True, "ignore_eos": True}  # fmt: skip
            for _ in range(6):
                client = await stack.enter_async_context(aiohttp.ClientSession())
                response = await client.post(url + "/v1/completions", json=long_body)
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        break
                streams.append((client, response))
            open_running = await _running(session, workers[0].url)
            for client, response in streams:
                response.close()
                await client.close()
            await asyncio.sleep(3)
            closed_running = await _running(session, workers[0].url)
        name = spec.name if spec is not None else "direct"
        print(
            f"  {name:>20}: "
            + ", ".join(
                f"{tokens}-token prompt TTFT p50 {statistics.median(t) * 1000:.1f} ms "
                f"(max {t[-1] * 1000:.1f})"
                for tokens, t in zip(ONE_WORKER_PROMPTS, ttfts, strict=True)
            )
            + f"; running on the worker with 6 streams open "
            f"{open_running}, 3 s after their clients closed {closed_running}",
            flush=True,
        )


# ---------------------------------------------------------------------------- main


def load_results(paths: Sequence[str]) -> list[Figures]:
    """Figures saved by ``--report`` (its ``results.json``), from one or more runs."""
    rows: list[Figures] = []
    for path in paths:
        # Each file's repetitions follow the previous files' (for the same pool, trace).
        before = {(f.pool, f.trace): f.repetition + 1 for f in rows}
        for item in json.loads(Path(path).read_text("utf-8")):
            for key in ("per_gpu", "per_gpu_aborted", "per_gpu_ttft_s"):
                item[key] = tuple(item.get(key, ()))
            item.setdefault("ttft_p99_served_s", item["ttft_p99_s"])
            item["repetition"] += before.get((item["pool"], item["trace"]), 0)
            rows.append(Figures(**item))
    return rows


async def main_async(args: argparse.Namespace) -> int:
    if args.render:
        saved = load_results(args.render)
        order = [r.name for r in ROUTERS if any(f.router == r.name for f in saved)]
        header = f"Rendered from {', '.join(args.render)}."
        print(f"report: {write_report(Path(args.report or '.'), saved, order, header)}")
        return 0
    names = args.routers.split(",") if args.routers else [r.name for r in ROUTERS]
    if args.smoke and not args.routers:
        names = list(SMOKE_ROUTERS)
    by_name = {r.name: r for r in ROUTERS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        print(f"unknown routers {unknown}; known: {', '.join(by_name)}", file=sys.stderr)
        return 2
    specs = [by_name[n] for n in names]
    for spec in specs:
        if spec.peer is not None:
            require(spec.peer)  # a missing peer fails the benchmark, never skips it
            assert spec.policy in POLICIES[spec.peer]
    if args.one_worker:
        await one_worker(specs)
        return 0
    pools = {"smoke": SMOKE_POOL} if args.smoke else {p: POOLS[p] for p in args.pools.split(",")}
    traces = [TraceKind(t if t != "mooncake" else "mooncake") for t in args.traces.split(",")]
    if args.smoke:
        traces = traces[:1]
    duration = 4.0 if args.smoke else args.duration
    header = (
        f"Llama-3.1-8B; arrivals for {args.busy:.0%} GPU busy, speedup up to "
        f"{args.speedup:g} (at most {args.max_wall_rate:g} req/s wall), {duration:g} s of "
        f"arrivals per run, {args.repeat} repetition(s); peers: "
        + ", ".join(f"{p.value} {version(p)}" for p in Peer)
        + f"; {os.cpu_count()} CPUs (shared)."
    )
    print(header, flush=True)
    # SIGTERM (or SIGINT, which a background shell ignores) stops the run cleanly: every
    # worker and router is stopped on the way out, and what was measured is reported.
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    rows: list[Figures] = []
    try:
        await _matrix(args, pools, traces, specs, names, duration, rows)
    except asyncio.CancelledError:
        if args.report and rows:
            stopped = header + f" Stopped (SIGTERM) after {len(rows)} run(s)."
            print(f"\nreport: {write_report(Path(args.report), rows, names, stopped)}")
        raise
    if args.report:
        path = write_report(Path(args.report), rows, names, header)
        print(f"\nreport: {path}")
    missed = not verdicts(rows, args.ours)[1] if args.ours in names else False
    if args.smoke:
        bad = [f for f in rows if f.success < 0.5]
        if bad:
            print(f"smoke: {', '.join(f.router for f in bad)} served under half", file=sys.stderr)
            return 1
        return 0
    return 1 if missed else 0


async def _matrix(
    args: argparse.Namespace,
    pools: Mapping[str, Sequence[str]],
    traces: Sequence[TraceKind],
    specs: list[RouterSpec],
    names: Sequence[str],
    duration: float,
    rows: list[Figures],
) -> None:
    """Every pool × trace × repetition × router in turn, each run's figures appended
    to ``rows`` as it ends (so a stopped run still has what it measured)."""
    for pool_name, pool in pools.items():
        for trace in traces:
            work = arrivals(
                trace, pool, busy=args.busy, speedup=args.speedup, duration_s=duration,
                max_wall_rate=args.max_wall_rate,
            )  # fmt: skip
            plan, speedup = work.plan, work.speedup
            floor_p99, ceiling = reach(work.floor, window_gpu_s(plan, speedup))
            print(
                f"\n== {pool_name} ({', '.join(pool)}) · {trace.value}: {len(plan)} requests, "
                f"{work.rate:.2f} req/s of GPU time offered (load {work.load:.2f} of the "
                f"pool's saturated capacity), speedup {speedup:.2f} = "
                f"{work.rate * speedup:.1f} req/s wall, mean input "
                f"{statistics.fmean(a.input_tokens for a in plan):,.0f} tokens, output "
                f"{statistics.fmean(a.output_tokens for a in plan):,.0f}; no router can beat "
                f"TTFT p99 {floor_p99 * 1000:,.0f} ms (the floor; the pool's capacity alone: "
                f"{work.floor.capacity_p99_s * 1000:,.0f} ms) or goodput "
                f"{ceiling:.2f} req/s (the ceiling)",
                flush=True,
            )
            combo: list[Figures] = []
            for rep in range(args.repeat):
                shift = rep % len(specs)
                for spec in specs[shift:] + specs[:shift]:
                    f = await run_one(spec, pool_name, pool, trace, plan, speedup, rep, work.floor)
                    combo.append(f)
                    rows.append(f)
                    print(f"  rep {rep + 1} {row(f)}", flush=True)
            print("\n".join(ranges(combo, names)))
            lines, _ = verdicts(combo)
            print("\n".join(lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="seconds: 2 GPUs, 4 routers")
    parser.add_argument("--pools", default="hetero,h100", help=f"of {', '.join(POOLS)}")
    parser.add_argument("--traces", default=",".join(t.value for t in TRACES))
    parser.add_argument("--routers", default="", help=f"of {', '.join(r.name for r in ROUTERS)}")
    parser.add_argument(
        "--ours", default=OURS, help="the gtm router whose verdict sets the exit status"
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions, order rotated")
    parser.add_argument("--speedup", type=float, default=10.0, help="emulated GPUs N× fast")
    parser.add_argument(
        "--busy", type=float, default=0.85, help="share of time the mean GPU has work"
    )
    parser.add_argument(
        "--max-wall-rate", type=float, default=25.0,
        help="lower the speedup (not below 1) to stay under this many requests/s wall",
    )  # fmt: skip
    parser.add_argument("--duration", type=float, default=40.0, help="arrival window, wall s")
    parser.add_argument("--report", default="", help="write README.md, plot, JSON here")
    parser.add_argument(
        "--render", nargs="+", default=[], metavar="RESULTS_JSON",
        help="no run: write --report from saved results.json files (runs merged)",
    )  # fmt: skip
    parser.add_argument(
        "--one-worker", action="store_true",
        help="each router before one idle worker: TTFT added, client cancellation",
    )  # fmt: skip
    try:
        code = asyncio.run(main_async(parser.parse_args()))
    except asyncio.CancelledError:
        raise SystemExit(
            "router side-by-side: stopped (SIGTERM); workers and routers stopped"
        ) from None
    sys.exit(code)


if __name__ == "__main__":
    main()

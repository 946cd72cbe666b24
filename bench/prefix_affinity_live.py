"""Prefix-cache affinity live: gtm against the llm-d-like and SGLang-like baselines on a
real ``gtm up --processes`` deployment (issue 22, item 3; the simulator's half is
``bench/prefix_affinity.py``).

    python bench/prefix_affinity_live.py                # 85 % and 120 %, one repetition
    python bench/prefix_affinity_live.py --repeat 2     # two, interleaved
    python bench/prefix_affinity_live.py --smoke        # one short run per policy, 85 %
    python bench/prefix_affinity_live.py --gpus 2 --duration 90 --load 0.85,1.2
    python bench/prefix_affinity_live.py --simulate     # no live run: the same requests
                                                        # on the same GPUs, simulated

Each run is a fresh ``gtm up --processes --policy-profile POLICY`` (every tier runs the
simulator's policy of that name, :mod:`gtmctl.up.policy_profile`) on private loopback
addresses: two regions, two zones each, ``--gpus`` L40S per zone (emulated, serving
Llama-3.1-8B; the baselines pool each region's under one zone agent, as the simulator
does). The policies (``gtm``, ``gtm-no-affinity``,
``llm-d-blend``, ``sglang-cache-aware``) take turns: for each repetition and load, one
run of each, so that a slow spell of the shared machine falls on all of them.

The Mooncake conversation trace (``hash_ids`` are real shared prefixes; requests longer
than :data:`fleetsim.workload.MAX_INPUT` tokens left out, as the simulator does) is
replayed open loop through the front door, with ``gtm load``'s prompts and tenant; each
conversation (its second prompt block, as the simulator keys a session) comes from one
client city. A few GPUs replaying the trace at its own pace would see a conversation's
next turn minutes later, after the window: the trace runs at the pace of the
simulator's fleet (``--sim-gpus``) at the same load, and only a share of its
conversations is kept (:func:`workload`), so turns come as close together as in
``bench/prefix_affinity.py``. **Load** is as in :mod:`fleetsim.bench`:
offered requests/s ÷ the fleet's capacity (:func:`fleetsim.workload.fleet_capacity_rps`),
with the emulated GPUs ``--speedup`` × as fast as real ones, so the trace is replayed at
``load × capacity × speedup`` requests per wall second; every latency is multiplied back
by the speedup ("GPU seconds", what a real GPU would take), and the arrival window is
counted the same way. The speedup is at least 1: the tiers price GPUs at their real
rates (``gtm.gpu_profiles``), so slower emulated GPUs would miss the zone agents'
first-byte deadlines and be retried elsewhere. What sizes a run for a small machine is
the request rate (the deployment spends a few hundred ms of CPU per Mooncake request,
``bench/sim_fidelity.py``): the slowest GPU class that holds the trace's prompts (L40S)
and few of them — four by default, ~2.5 requests/s at 120 % load.

Per load it prints each policy's

* prefix-hit share: cached prompt tokens ÷ prompt tokens, as the GPU workers report them
  in each answer's usage (``prompt_tokens_details.cached_tokens``);
* goodput: requests/s within the SLO of :mod:`fleetsim.metrics` (TTFT ≤ 2 s, TPOT ≤
  100 ms, in GPU seconds) over the arrival window;
* p99 TTFT over the requests not refused (a request without an answer counts as
  infinitely late, as in the simulator);
* refused (an HTTP error answer) and timed out (no first token within the simulator's
  client timeout, or not done when the drain ends);

then gtm's ratios against the baselines of the same repetition and the targets
(:func:`bench.prefix_affinity.verdicts`: goodput ≥ every baseline's, prefix-hit share ≥
0.9 × the best baseline's), and with ``--repeat`` the range of each figure. Per run it
also prints where conversations' later turns ran against their previous turn (same
region, same GPU), the evidence behind a hit share. ``--simulate`` runs the very same
requests (arrivals, sizes, each conversation's client city) on the same GPUs in the
fleet simulator instead, one run per policy, in seconds: what the live figures would be
on a machine that keeps up, and whether a difference is the policy's or the live
path's. Wall-clock
figures on a shared machine are noisy: goodput and hit share are what the targets read.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

# Run as a script, sys.path starts at bench/, not at the repository root: add the root so
# the other benchmarks import as a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.prefix_affinity import BASELINES, BEFORE, OURS, table, verdicts
from bench.sim_fidelity import Reply, _wait_banner, body_for, send
from bench.sim_fidelity import topology as loopback_topology
from fleetsim.bench import BenchConfig, prepare
from fleetsim.fleet import fleet_from_topology
from fleetsim.geography import CITIES_FILE, read_places
from fleetsim.metrics import SLO_TPOT_S, SLO_TTFT_S, Summary, summarise
from fleetsim.policies import policy
from fleetsim.simulator import CLIENT_TIMEOUT_S, DRAIN_S, Simulator
from fleetsim.traces import (
    MOONCAKE_BLOCK_TOKENS,
    Trace,
    TraceKind,
    TraceRequest,
    data_dir,
    load_trace,
)
from fleetsim.workload import MAX_INPUT, SimRequest, fleet_capacity_rps
from gtm.metrics import new_registry
from gtm.net import free_ports
from gtm.policy_store import activate
from gtm.stats import percentile
from gtm.tasks import TaskSupervisor
from gtm.topology import Topology
from gtmctl.load import LoadConfig, PromptMaker
from gtmctl.up.clients import City, Client, ClientSampler, bundled_cities
from gtmctl.up.config import UpConfig
from gtmctl.up.fleet import load_policies

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
REGIONS = ("us-east", "eu-west")
#: The GPU class of every emulated GPU: the slowest that holds the trace's prompts, so
#: 120 % load is few requests per second.
GPU_TYPE = "L40S"
POLICIES = (OURS, BEFORE, *BASELINES)
#: Wall seconds between the live tiers' summaries, and between a zone agent's scrapes of
#: its GPUs (zone_agent.config.ZoneConfig, gtm up's --scrape-interval default).
SUMMARY_INTERVAL_S = 1.0
SCRAPE_INTERVAL_S = UpConfig().scrape_interval_s
#: Longest drain after the arrival window in a --smoke run, wall s (otherwise the
#: simulator's DRAIN_S, in GPU seconds).
SMOKE_DRAIN_S = 20.0


def topology(gpus_per_zone: int = 1, zones_per_region: int = 2) -> Topology:
    """Two regions on a private loopback block, ``zones_per_region`` zones of
    ``gpus_per_zone`` GPUs each (:func:`bench.sim_fidelity.topology`)."""
    return loopback_topology(
        ((GPU_TYPE, gpus_per_zone),), regions=REGIONS, zones_per_region=zones_per_region
    )


def gpu_types(topo: Topology) -> list[str]:
    return [g.type for r in topo.regions for z in r.zones for g in z.gpus for _ in range(g.count)]


# ---------------------------------------------------------------------------- figures


@dataclass(frozen=True, slots=True)
class LiveFigures:
    """One policy's run, in GPU seconds (wall × speedup); the fields
    :func:`bench.prefix_affinity.table` and ``verdicts`` read."""

    policy: str
    requests: int
    prefix_hit: float
    goodput_rps: float
    ttft_p99: float
    refused: int
    timed_out: int
    failed: int


def outcome(reply: Reply) -> str:
    """``ok``, ``refused`` (an HTTP error answer), ``timed_out`` or ``failed``."""
    if reply.ok:
        return "ok"
    if reply.status >= 400:
        return "refused"
    if reply.reason in ("TimeoutError", "ServerTimeoutError", "cancelled", "not-sent"):
        return "timed_out"
    return "failed"


def live_figures(
    policy: str, replies: Sequence[Reply], outputs: Sequence[int], window_s: float, speedup: float
) -> LiveFigures:
    """The figures of one run: ``replies`` and the ``outputs`` (max tokens) asked, in
    the same order; ``window_s``: the arrival window, wall s."""
    kinds = [outcome(r) for r in replies]
    served = [r for r, k in zip(replies, kinds, strict=True) if k == "ok"]
    prompt = sum(r.prompt_tokens for r in served)
    cached = sum(r.cached_tokens for r in served)
    good = 0
    for r, out, kind in zip(replies, outputs, kinds, strict=True):
        if kind != "ok" or r.ttft_s is None:
            continue
        ttft = r.ttft_s * speedup
        tpot = (r.e2e_s - r.ttft_s) * speedup / (out - 1) if out > 1 else 0.0
        good += ttft <= SLO_TTFT_S and tpot <= SLO_TPOT_S
    late = [
        r.ttft_s * speedup if k == "ok" and r.ttft_s is not None else math.inf
        for r, k in zip(replies, kinds, strict=True)
        if k != "refused"
    ]
    return LiveFigures(
        policy=policy,
        requests=len(replies),
        prefix_hit=cached / prompt if prompt else 0.0,
        goodput_rps=good / max(1e-9, window_s * speedup),
        ttft_p99=percentile(sorted(late), 0.99) if late else math.nan,
        refused=kinds.count("refused"),
        timed_out=kinds.count("timed_out"),
        failed=kinds.count("failed"),
    )


def ranges(runs: Sequence[Sequence[LiveFigures]]) -> str:
    """Per policy, the min–max of each target figure over repetitions."""
    out = ["| policy | prefix hit | goodput req/s | TTFT p99 s |", "|---|---:|---:|---:|"]
    for name in POLICIES:
        rows = [f for run in runs for f in run if f.policy == name]
        if not rows:
            continue
        hit = [f.prefix_hit for f in rows]
        good = [f.goodput_rps for f in rows]
        p99 = [f.ttft_p99 for f in rows]
        out.append(
            f"| {name} | {min(hit):.1%}–{max(hit):.1%} | {min(good):.2f}–{max(good):.2f} | "
            f"{min(p99):.2f}–{max(p99):.2f} |"
        )
    return "\n".join(out)


# ---------------------------------------------------------------------------- live


@contextmanager
def deployment(topo: Topology, policy: str, speedup: float, workdir: Path) -> Iterator[str]:
    """``gtm up --processes --policy-profile policy`` on ``topo``; yields the front
    door's URL, stops it (SIGINT) on the way out."""
    topo_path = workdir / "topology.yaml"
    topo_path.write_text(yaml.safe_dump(topo.model_dump(mode="json")), "utf-8")
    dns_port, http_port = free_ports("127.0.0.1", 2)
    command = [
        sys.executable, "-m", "gtmctl", "up", "--processes", "--topology", str(topo_path),
        "--dns-listen", f"127.0.0.1:{dns_port}", "--http-listen", f"127.0.0.1:{http_port}",
        "--run-dir", str(workdir / "run"), "--admin-dir", str(workdir / "admin"),
        "--speedup", f"{speedup:g}", "--policy-profile", policy,
    ]  # fmt: skip
    stderr = (workdir / "up.stderr").open("wb")
    up = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    try:
        _wait_banner(up, workdir)
        yield f"http://127.0.0.1:{http_port}"
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        stderr.close()


async def replay(
    url: str, load: LoadConfig, window: Sequence[TraceRequest], speedup: float, drain_s: float
) -> tuple[list[Reply], str]:
    """Open loop through the front door; a request with no byte for the simulator's
    client timeout gives up, and whatever is unfinished when the drain ends is cut.
    Returns the replies, in ``window``'s order, and the front door's region events."""
    prompts = PromptMaker(load.seed)
    prepared = []
    for r, client in zip(window, clients_of(window, load.seed), strict=True):
        # Bodies first: no prompt generation during the run.
        headers = {
            "Authorization": f"Bearer {load.api_key}",
            "X-Forwarded-For": str(client.address),
        }
        prepared.append((body_for(prompts, load, r), headers))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=CLIENT_TIMEOUT_S / speedup)
    connector = aiohttp.TCPConnector(limit=load.max_in_flight)
    replies: list[Reply | None] = [None] * len(window)
    supervisor = TaskSupervisor(registry=new_registry(), component="prefix-affinity-live")
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(k: int) -> None:
            replies[k] = await send(session, url, prepared[k][0], prepared[k][1])

        start = time.monotonic()
        tasks = []
        for k, r in enumerate(window):
            delay = start + r.at_s / load.rate_scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(supervisor.spawn(f"request-{k}", one(k)))
        if tasks:
            await asyncio.wait(tasks, timeout=drain_s)
        await supervisor.aclose()  # what is left is cut: timed out
        events = await front_door_events(session, url)
    got = [
        r if r is not None else Reply(False, 0, "cancelled", None, 0.0, "", "", 0, 0)
        for r in replies
    ]
    return got, events


#: The front door's counters that say why a conversation changed region: health
#: transitions of a region (its checks or summaries failing on a starved machine) and
#: retries on another region.
EVENT_FAMILIES = ("gtm_global_region_health_changes", "gtm_global_retries")


async def front_door_events(session: aiohttp.ClientSession, url: str) -> str:
    """The front door's region health changes and retries during the run."""
    try:
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"metrics not read ({type(exc).__name__})"
    found = []
    for family in text_string_to_metric_families(text):
        if family.name in EVENT_FAMILIES:
            found += [
                f"{family.name.removeprefix('gtm_global_')}"
                f"{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))}}} {s.value:g}"
                for s in family.samples
                if s.name.endswith("_total") and s.value
            ]
    return ", ".join(found) or "no region health change, no retry"


def run_one(
    topo: Topology, policy: str, load: LoadConfig, window: Sequence[TraceRequest],
    speedup: float, settle_s: float, duration_s: float, drain_s: float,
) -> LiveFigures:  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="gtm-affinity-live-") as tmp,
        deployment(topo, policy, speedup, Path(tmp)) as url,
    ):
        if settle_s > 0:
            time.sleep(settle_s)  # the zone agents' slow start of new GPUs
        started = time.monotonic()
        replies, events = asyncio.run(replay(url, load, window, speedup, drain_s))
        wall = time.monotonic() - started
    outputs = [max(1, min(r.output_tokens, load.max_output_tokens)) for r in window]
    figures = live_figures(policy, replies, outputs, duration_s, speedup)
    reasons = Counter(r.reason for r in replies if not r.ok)
    print(
        f"  {policy}: {figures.requests} requests in {wall:.0f} s wall, prefix hit "
        f"{figures.prefix_hit:.1%}, goodput {figures.goodput_rps:.2f} req/s, refused "
        f"{figures.refused}, timed out {figures.timed_out}, failed {figures.failed}"
        + (f" ({', '.join(f'{k} {n}' for k, n in reasons.most_common())})" if reasons else "")
        + "\n    "
        + placement(window, replies, speedup)
        + f"\n    front door: {events}",
        flush=True,
    )
    return figures


def placement(window: Sequence[TraceRequest], replies: Sequence[Reply], speedup: float) -> str:
    """Where conversations' later turns ran, against their previous turn, and the
    served requests' median TTFT and TPOT (GPU s): what the hit share comes from."""
    last: dict[int, Reply] = {}
    turns = same_region = same_gpu = 0
    for r, reply in zip(window, replies, strict=True):
        if not reply.ok:
            continue
        before = last.get(session_of(r))
        if before is not None:
            turns += 1
            same_region += reply.region == before.region
            same_gpu += reply.gpu == before.gpu
        last[session_of(r)] = reply
    served = [x for x in replies if x.ok and x.ttft_s is not None]
    ttft = [x.ttft_s * speedup for x in served if x.ttft_s is not None]
    tpot = [
        (x.e2e_s - x.ttft_s) * speedup / max(1, o.output_tokens - 1)
        for x, o in zip(replies, window, strict=True)
        if x.ok and x.ttft_s is not None
    ]
    regions = Counter(x.region for x in served)
    spilled = sum(bool(x.spilled_from) for x in served)
    return (
        f"later turns served ({turns}): same region as the previous turn "
        f"{same_region / max(1, turns):.0%}, same GPU {same_gpu / max(1, turns):.0%}; "
        f"regions {dict(regions)}, {spilled} spilled to a peer; "
        f"TTFT p50 {percentile(sorted(ttft), 0.5):.2f} s, "
        f"TPOT p50 {1000 * percentile(sorted(tpot), 0.5):.0f} ms"
    )


def clients_of(
    window: Sequence[TraceRequest], seed: int, cities: tuple[City, ...] | None = None
) -> list[Client]:
    """Each request's client: one per conversation, drawn in order of first turn."""
    sampler = ClientSampler(cities or bundled_cities(), random.Random(seed))
    clients: dict[int, Client] = {}
    return [clients.setdefault(session_of(r), sampler.sample()) for r in window]


def simulated(
    topo: Topology, window: Sequence[TraceRequest], load: LoadConfig, speedup: float,
    duration_s: float, drain_s: float,
) -> list[Summary]:  # fmt: skip
    """The same requests (arrivals, sizes, conversations' client cities) on the same
    GPUs in the fleet simulator, one run per policy (no network, no tier overhead):
    what the live figures would be with a machine that keeps up."""
    active = activate(1, load_policies(()))
    fleet = fleet_from_topology(active, topo, MODEL)
    cities = bundled_cities()
    index = {id(c): k for k, c in enumerate(cities)}
    requests = [
        SimRequest(
            at_s=r.at_s / load.rate_scale * speedup,
            input_tokens=min(r.input_tokens, load.max_input_tokens),
            output_tokens=max(1, min(r.output_tokens, load.max_output_tokens)),
            prefix_hashes=r.prefix_hashes,
            block_tokens=MOONCAKE_BLOCK_TOKENS,
            hash_key=hash(r.prefix_hashes[:1]) if r.prefix_hashes else k,
            tenant="load-test",
            country=client.city.country,
            point=client.city.location,
            place_id=index[id(client.city)],
        )
        for k, (r, client) in enumerate(
            zip(window, clients_of(window, load.seed, cities), strict=True)
        )
    ]
    out = []
    for name in POLICIES:
        sim = Simulator(
            fleet, active, policy(name), requests, model=MODEL,
            tick_s=SUMMARY_INTERVAL_S * speedup, scrape_s=SCRAPE_INTERVAL_S * speedup,
            duration_s=duration_s * speedup, drain_s=drain_s * speedup, network=False,
        )  # fmt: skip
        out.append(summarise(sim.run(), requests))
    return out


def session_of(r: TraceRequest) -> int:
    """The conversation ``r`` belongs to: its second prompt block, as the simulator keys
    a session (:func:`fleetsim.workload.build_requests`; every Mooncake prompt shares the
    first). A prompt of one block is a conversation of its own."""
    hashes = r.prefix_hashes
    return hashes[1] if len(hashes) > 1 else -1 - hash((r.at_s, r.input_tokens))


def kept(session: int, fraction: float) -> bool:
    """Whether ``session`` is among the ``fraction`` of conversations replayed (a fixed
    draw per session, so a larger fraction keeps a superset)."""
    unit = ((session * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF) / 2.0**64
    return unit < fraction


def workload(
    trace: Trace, rate_rps: float, duration_s: float, trace_speed: float
) -> tuple[tuple[TraceRequest, ...], float]:
    """The requests to replay at ``rate_rps`` over ``duration_s`` wall seconds, and the
    trace's speed-up (trace s per wall s).

    The trace runs ``trace_speed`` × its own pace, and only a share of its conversations
    is kept so that the rate is ``rate_rps``: a conversation's turns come as far apart as
    in the simulator's fleet, whose size sets its pace (a small fleet replaying the trace
    at its own rate would see a conversation's next turn minutes later, past the
    window). When even every conversation is too few, the trace runs faster."""
    speed = max(trace_speed, rate_rps / trace.rate_per_s)
    fraction = rate_rps / (trace.rate_per_s * speed)
    window = trace.window(duration_s, speed)
    return tuple(r for r in window if kept(session_of(r), fraction)), speed


def simulated_capacity(gpus: int) -> float:
    """Requests/s of the simulator bench's fleet of ``gpus`` GPUs (:mod:`fleetsim.bench`)."""
    config = BenchConfig(gpus=gpus, loads=(1.0,), duration_s=60.0, policies=(OURS,))
    trace = load_trace(TraceKind.MOONCAKE)
    return prepare(config, trace, read_places(data_dir() / CITIES_FILE)).capacity_rps


def replayed(trace: Trace) -> Trace:
    """The trace without the requests the simulator leaves out (longer than MAX_INPUT)."""
    kept = tuple(r for r in trace.requests if r.input_tokens + r.output_tokens <= MAX_INPUT)
    return dataclasses.replace(trace, requests=kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one short run per policy at 85 %%")
    parser.add_argument("--load", default="0.85,1.2", help="comma-separated loads")
    parser.add_argument("--gpus", type=int, default=1, help="L40S per zone (four zones)")
    parser.add_argument("--speedup", type=float, default=1.0, help="emulated GPU speed (≥ 1)")
    parser.add_argument("--duration", type=float, default=60.0, help="arrival window, wall s")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (interleaved)")
    parser.add_argument(
        "--sim-gpus", type=int, default=120,
        help="the trace runs at the pace of a simulated fleet of this size at the same load "
        "(bench/prefix_affinity.py's default), a share of its conversations kept",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="clients and prompts")
    parser.add_argument(
        "--simulate", action="store_true",
        help="no live run: the same requests on the same GPUs in the fleet simulator",
    )  # fmt: skip
    parser.add_argument(
        "--settle", type=float, default=30.0,
        help="wall s between the deployment being up and the load (the GPUs' slow start)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.speedup < 1:
        parser.error("--speedup must be at least 1 (the tiers price GPUs at real rates)")
    loads = (0.85,) if args.smoke else tuple(float(x) for x in args.load.split(",") if x)
    duration = 5.0 if args.smoke else args.duration
    settle = 0.0 if args.smoke else args.settle
    drain = SMOKE_DRAIN_S if args.smoke else DRAIN_S / args.speedup
    trace = replayed(load_trace(TraceKind.MOONCAKE))
    topo = topology(args.gpus)
    capacity = fleet_capacity_rps(gpu_types(topo), MODEL, trace)
    sim_capacity = simulated_capacity(args.sim_gpus)
    results: dict[float, list[list[LiveFigures]]] = {load: [] for load in loads}
    for repeat in range(args.repeat):
        for load_share in loads:
            rate = load_share * capacity * args.speedup
            pace = load_share * sim_capacity / trace.rate_per_s
            window, speed = workload(trace, rate, duration, pace)
            load = LoadConfig(
                rate_scale=speed, duration_s=duration, seed=args.seed,
                max_input_tokens=MAX_INPUT, timeout_s=drain + duration,
            )  # fmt: skip
            if args.simulate:
                print(f"== simulated, load {load_share:.0%}: {len(window)} requests")
                rows = simulated(topo, window, load, args.speedup, duration, drain)
                print(table(rows))
                print("\n".join(verdicts(rows)[0]), flush=True)
                continue
            print(
                f"== repetition {repeat + 1}, load {load_share:.0%}: {len(window)} requests "
                f"in {duration:g} s wall ({len(gpu_types(topo))} GPUs, capacity ≈ "
                f"{capacity:.2f} req/s of real GPUs, speedup {args.speedup:g}; the trace "
                f"{speed:.1f}× its pace, {len({session_of(r) for r in window})} "
                "conversations)",
                flush=True,
            )
            row = [
                run_one(topo, name, load, window, args.speedup, settle, duration, drain)
                for name in POLICIES
            ]
            results[load_share].append(row)
            print(table(row))
            print("\n".join(verdicts(row)[0]), flush=True)
    missed = 0
    for load_share, runs in results.items():
        if args.repeat > 1:
            print(f"\nload {load_share:.0%}, {args.repeat} repetitions (min–max):")
            print(ranges(runs))
        for row in runs:
            missed += not verdicts(row)[1]
    return 0 if missed == 0 or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())

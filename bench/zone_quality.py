"""Routing quality on a small live fleet: the default profile against three baselines.

Fleet: 8 ``gtm gpu-sim`` worker processes of mixed types (2 × H100, 2 × A100-80GB,
2 × L40S, 2 × V100, Llama-3.1-8B), behind one ``gtm zone`` process, restarted (caches
flushed) for every profile. Workload: the Mooncake FAST'25 *conversation* trace
(shipped with gtm in ``gtm/data/traces/mooncake``, Apache-2.0): arrival time,
input and output length, and ``hash_ids`` — 512-token prefix blocks, equal ids meaning
equal prefixes. Each id becomes a deterministic 512-token text block (one word = one
token for :mod:`gtm.tokens`, which the workers charge with), so requests that share ids
share real prefixes and hit the workers' prefix caches.

Requests are replayed open-loop at their trace times, compressed by the workers'
``--speedup`` (and by ``--load`` to raise the rate), as streaming completions with
``max_tokens`` = the trace's output length (``ignore_eos``). TTFT is measured by the
client to the first streamed token and converted to engine time (× speedup), i.e. what
the same fleet of real GPUs would show. Throughput is output tokens per engine second
over the run.

Profiles: ``default`` (predicted TTFT with prefix affinity, bounded load, decode
pressure) against ``round-robin``, ``least-connections`` and ``least-pending-tokens``
(issue 5: the default must beat all three on p99 TTFT). ``--profiles`` adds others.

    python bench/zone_quality.py           # 300 requests per profile (~2 min)
    python bench/zone_quality.py --smoke   # 40 requests, 2 profiles (~20 s)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import aiohttp

from fleetsim.traces import TRACE_FILES, TraceKind, data_dir
from gtm import data as gtm_data
from gtm.gpu_profiles import LLAMA_8B
from gtm.stats import percentile
from gtm.testing.processes import start_listening

TRACE = data_dir() / TRACE_FILES[TraceKind.MOONCAKE]  # stored .xz; read_text finds it
BLOCK_TOKENS = 512  # Mooncake's hash_ids block size
FLEET = ("H100", "H100", "A100-80GB", "A100-80GB", "L40S", "L40S", "V100", "V100")
BASELINES = ("round-robin", "least-connections", "least-pending-tokens")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    at_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def synthetic_trace(count: int) -> list[TraceRequest]:
    """Conversations whose every turn repeats the history and adds two blocks (for a
    smoke run given a --trace that does not exist)."""
    rng = random.Random(5)
    out: list[TraceRequest] = []
    histories: list[list[int]] = [[] for _ in range(8)]
    next_id = 0
    for i in range(count):
        history = histories[rng.randrange(len(histories))]
        history.extend((next_id, next_id + 1))
        next_id += 2
        out.append(TraceRequest(i * 150.0, len(history) * BLOCK_TOKENS - 100, 200, tuple(history)))
    return out


def load_trace(path: Path, count: int, max_input: int) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    for line in gtm_data.read_text(path).splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row["input_length"] > max_input:
            continue
        out.append(
            TraceRequest(
                float(row["timestamp"]),
                int(row["input_length"]),
                max(1, int(row["output_length"])),
                tuple(row["hash_ids"]),
            )
        )
        if len(out) == count:
            break
    return out


@cache
def _vocabulary() -> tuple[str, ...]:
    rng = random.Random(512)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return tuple(
        "".join(rng.choice(letters) for _ in range(rng.randint(3, 5))) for _ in range(4096)
    )


@cache
def block_text(hash_id: int) -> tuple[str, ...]:
    """512 words, each one token (a leading space and ≤ 5 letters), fixed by the id."""
    rng = random.Random(hash_id)
    words = _vocabulary()
    return tuple(" " + words[rng.randrange(len(words))] for _ in range(BLOCK_TOKENS))


def prompt(request: TraceRequest) -> str:
    parts: list[str] = []
    remaining = request.input_length
    for hash_id in request.hash_ids:
        take = min(BLOCK_TOKENS, remaining)
        parts.extend(block_text(hash_id)[:take])
        remaining -= take
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class Outcome:
    ttft_s: float | None  # wall seconds (None: failed)
    tokens: int


async def send(http: aiohttp.ClientSession, url: str, request: TraceRequest, text: str) -> Outcome:
    body = {
        "model": LLAMA_8B,
        "prompt": text,
        "max_tokens": request.output_length,
        "ignore_eos": True,
        "stream": True,
    }
    start_time = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    try:
        async with http.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                await response.read()
                return Outcome(None, 0)
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                if ttft is None:
                    ttft = time.perf_counter() - start_time
                tokens += 1
    except (aiohttp.ClientError, TimeoutError):
        return Outcome(None, tokens)
    return Outcome(ttft, tokens)


@dataclass(frozen=True, slots=True)
class Result:
    profile: str
    ttft_ms: list[float]  # engine ms
    failed: int
    tokens: int
    makespan_s: float  # engine seconds


async def run_profile(
    profile: str, trace: Sequence[TraceRequest], texts: Sequence[str], speedup: float, load: float
) -> Result:
    workers = await asyncio.gather(
        *(
            start_listening(
                [
                    "gpu-sim",
                    "--port",
                    "0",
                    "--gpu-type",
                    gpu,
                    "--speedup",
                    str(speedup),
                    "--warmup-passes",
                    "0",
                    "--seed",
                    str(i),
                ]
            )
            for i, gpu in enumerate(FLEET)
        )
    )
    args = ["zone", "--zone", "bench-a", "--region", "bench", "--listen", "127.0.0.1:0",
            "--profile", profile, "--scrape-interval", "0.1"]  # fmt: skip
    for i, (worker, gpu) in enumerate(zip(workers, FLEET, strict=True)):
        args += ["--worker", f"{worker.url},gpu={gpu},id=gpu-{i}"]
    agent = await start_listening(args)
    try:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            origin = trace[0].at_ms
            began = time.perf_counter()

            async def one(request: TraceRequest, text: str) -> Outcome:
                due = (request.at_ms - origin) / 1000.0 / speedup / load
                delay = due - (time.perf_counter() - began)
                if delay > 0:
                    await asyncio.sleep(delay)
                return await send(http, agent.url, request, text)

            outcomes = await asyncio.gather(*(one(r, t) for r, t in zip(trace, texts, strict=True)))
            makespan = (time.perf_counter() - began) * speedup
    finally:
        await agent.stop()
        for worker in workers:
            await worker.stop()
    ttfts = [o.ttft_s * speedup * 1000 for o in outcomes if o.ttft_s is not None]
    return Result(
        profile,
        ttfts,
        sum(o.ttft_s is None for o in outcomes),
        sum(o.tokens for o in outcomes),
        makespan,
    )


async def main_async(args: argparse.Namespace) -> int:
    count = 40 if args.smoke else args.requests
    profiles = ["default", *(["least-pending-tokens"] if args.smoke else BASELINES)]
    profiles += [p for p in args.profiles if p not in profiles]
    if gtm_data.find(args.trace).exists():
        trace = load_trace(args.trace, count, args.max_input)
    elif args.smoke:
        print(f"trace not found ({args.trace}): smoke run on a synthetic conversation trace")
        trace = synthetic_trace(count)
    else:
        print(f"trace not found: {args.trace} (pass --trace PATH)", file=sys.stderr)
        return 2
    texts = [prompt(r) for r in trace]
    span = (trace[-1].at_ms - trace[0].at_ms) / 1000.0
    print(
        f"trace: {len(trace)} requests over {span:.0f} s of trace time, "
        f"mean input {statistics.fmean(r.input_length for r in trace):,.0f} tokens, "
        f"mean output {statistics.fmean(r.output_length for r in trace):,.0f}; "
        f"fleet {', '.join(FLEET)}; speedup {args.speedup:g}, load ×{args.load:g}"
    )
    print(f"{'profile':>22} {'TTFT p50 ms':>12} {'p90 ms':>9} {'p99 ms':>9} {'mean ms':>9} "
          f"{'out tok/s':>10} {'failed':>7}")  # fmt: skip
    results: dict[str, Result] = {}
    for profile in profiles:
        result = await run_profile(profile, trace, texts, args.speedup, args.load)
        results[profile] = result
        print(
            f"{profile:>22} {percentile(result.ttft_ms, 0.5):>12,.0f} "
            f"{percentile(result.ttft_ms, 0.9):>9,.0f} {percentile(result.ttft_ms, 0.99):>9,.0f} "
            f"{statistics.fmean(result.ttft_ms) if result.ttft_ms else float('nan'):>9,.0f} "
            f"{result.tokens / result.makespan_s:>10,.0f} {result.failed:>7}",
            flush=True,
        )
    ours = percentile(results["default"].ttft_ms, 0.99)
    for profile in profiles[1:]:
        theirs = percentile(results[profile].ttft_ms, 0.99)
        verdict = "beats" if ours < theirs else "DOES NOT beat"
        print(f"default p99 TTFT {ours:,.0f} ms {verdict} {profile} ({theirs:,.0f} ms): "
              f"{theirs / ours:.2f} ×")  # fmt: skip
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run for CI")
    parser.add_argument("--requests", type=int, default=300, help="trace requests to replay")
    parser.add_argument("--speedup", type=float, default=10.0, help="emulated GPUs run N× fast")
    parser.add_argument("--load", type=float, default=1.5, help="arrival rate × the trace's")
    parser.add_argument(
        "--max-input", type=int, default=32_768, help="skip longer prompts (V100 context)"
    )
    parser.add_argument("--profiles", nargs="*", default=[], help="more profiles to compare")
    parser.add_argument("--trace", type=Path, default=TRACE, help="a Mooncake-format trace")
    sys.exit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()

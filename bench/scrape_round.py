"""How long a scrape round holds the zone agent's event loop, by zone size.

Every ``scrape_interval_s`` (250 ms by default) the agent scrapes every worker's
``/metrics`` and rebuilds its view of the zone. Whatever of that runs in one loop
iteration holds every request the agent is relaying meanwhile: at a thousand GPUs, one
long iteration per round is a latency spike four times a second on the data path.

The benchmark runs a zone agent in this process against N workers served by one canned
``/metrics`` server in a subprocess (a busy vLLM's exposition, its counters growing from
one scrape to the next, so calibration and prompt sizes do their usual work). It drives
rounds one after another, and a probe task that yields at every loop iteration records
the longest gap between its turns: the longest the loop was held. Printed per zone size:

- the longest hold in a round (median over rounds, and the worst round),
- the view's rebuild (median; with slices, their sum),
- the agent's CPU per round (``time.process_time``, in rounds without the probe; the
  server is another process),
- the longest hold of a round of health checks (every worker's ``GET /health``),
- the longest hold while the agent serves its own ``/metrics`` (~8 series per GPU),
- what a GPU's ejection holds it for (out of the view before the next request),
- what a GPU joining the zone costs the view's consistent-hash ring, kept per GPU
  against hashed again.

``--baseline DIR`` measures a checkout of an earlier version the same way, interleaved
round for round set by set, and prints the ratios: the host's speed drifts, so only
paired figures compare.

``--requests`` adds what a client sees: ``wrk`` at concurrency 1 through ``gtm zone``
fronting the largest zone (one emulated H100 serving, the canned workers scraped and
health-checked), against the baseline's agent and the agent with its one GPU alone.

Run: ``python bench/scrape_round.py`` (``--smoke`` for CI: 16 workers, 2 rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gtm.testing.processes import GtmProcess
    from zone_agent.app import ZoneAgent

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, sys.path starts at bench/: the root last, for ``bench.zone_proxy``
# only (a baseline's tree, first on PYTHONPATH, must keep its own gtm).
sys.path.append(str(ROOT))
SIZES = (64, 1_000)
ROUNDS = 12
#: Expositions with growing counters, served in turn on each connection.
TEXTS = 64


# ----------------------------------------------------------------- the /metrics server


def _texts() -> list[bytes]:
    from gpusim.metrics import MetricsFlavor
    from gpusim.samples import busy_exposition

    out = []
    for k in range(TEXTS):
        body = busy_exposition(
            MetricsFlavor.VLLM, requests=64 + 8 * k, finished=48 + 8 * k, max_num_seqs=16
        ).encode()
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        out.append(head + body)
    return out


class _Canned(asyncio.Protocol):
    """Answers every request on its connection with the next exposition (any path)."""

    def __init__(self, texts: list[bytes]) -> None:
        self._texts = texts
        self._served = 0
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            self._buffer = self._buffer[end + 4 :]
            assert self._transport is not None
            self._transport.write(self._texts[min(self._served, len(self._texts) - 1)])
            self._served += 1


async def _serve() -> None:
    texts = _texts()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Canned(texts), "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin


# ----------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Round:
    hold_ms: float
    rebuild_ms: float
    cpu_ms: float
    #: The longest hold of a round of health checks (``GET /health`` of every worker).
    check_hold_ms: float
    #: The longest hold while the agent serves its own ``/metrics`` (to a Prometheus).
    metrics_hold_ms: float
    #: What taking an ejected GPU out of the view holds the loop for (0: none ejected,
    #: the zone's ejection bound reached).
    eject_ms: float


async def _probe(done: asyncio.Event, gaps: list[float]) -> None:
    """Yield at every loop iteration until ``done``, recording the gaps between turns."""
    last = time.perf_counter()
    while not done.is_set():
        await asyncio.sleep(0)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def _until_done(work: Awaitable[object], done: asyncio.Event) -> None:
    await asyncio.sleep(0)  # the probe's first turn
    try:
        await work
    finally:
        done.set()


async def _held_ms(work: Awaitable[object]) -> float:
    """The longest gap between the probe's turns while ``work`` runs."""
    gaps: list[float] = []
    done = asyncio.Event()
    await asyncio.gather(_probe(done, gaps), _until_done(work, done))
    return 1e3 * max(gaps, default=0.0)


async def _get(url: str) -> int:
    """``GET url`` over a plain socket (the client costs the loop next to nothing)."""
    host, _, rest = url.removeprefix("http://").partition(":")
    port, _, path = rest.partition("/")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    body = await reader.read()
    writer.close()
    return len(body)


async def _rounds(port: int, workers: int, rounds: int) -> list[Round]:
    from prometheus_client import CollectorRegistry

    from gtm.gpu_profiles import LLAMA_8B
    from gtm.serve import settle_collector
    from zone_agent.app import ZoneAgent
    from zone_agent.config import StaticWorker, ZoneConfig
    from zone_agent.health import HealthConfig

    types = ("H100", "A100-80GB", "L40S", "L4")
    config = ZoneConfig(
        zone="zone-a",
        region="region-1",
        port=0,
        # The benchmark drives the rounds itself: the agent's own loops stay quiet.
        scrape_interval_s=3600.0,
        scrape_timeout_s=30.0,
        stale_after_s=3600.0,
        # (Every round ejects a GPU of its own: no bound on how many may be out.)
        health=HealthConfig(check_interval_s=3600.0, max_ejected_fraction=1.0),
        workers=tuple(
            StaticWorker(
                url=f"http://127.0.0.1:{port}/w{i}",
                id=f"gpu-{i:04d}",
                gpu_type=types[i % len(types)],
                models=(LLAMA_8B,),
            )
            for i in range(workers)
        ),
    )
    registry = CollectorRegistry()
    agent = ZoneAgent(config, registry=registry)
    await agent.start()
    settle_collector()  # as `gtm zone` does once it is up
    rebuilds: list[float] = []
    histogram = "gtm_zone_view_build_seconds_sum"

    def built_s() -> float:
        # The agent's own figure where it has one (slices summed); else a wrapper.
        value: float | None = registry.get_sample_value(histogram)
        return value or 0.0

    if registry.get_sample_value(histogram) is None:
        rebuild = agent.rebuild

        def timed() -> object:
            started = time.perf_counter()
            try:
                return rebuild()
            finally:
                rebuilds.append(time.perf_counter() - started)

        agent.rebuild = timed  # type: ignore[method-assign,assignment]
    out: list[Round] = []
    try:
        for _ in range(rounds):
            # CPU in a round of its own: the probe's turns would count in it.
            cpu = time.process_time()
            await agent.scrape_round()
            cpu = time.process_time() - cpu
            # (Reading the registry collects every GPU's gauges: outside the probe's watch.)
            rebuilds.clear()
            before = built_s()
            hold = await _held_ms(agent.scrape_round())
            built = built_s() - before + sum(rebuilds)
            checks = await _held_ms(agent.check_round())
            exposed = await _held_ms(_get(f"{agent.url}/metrics"))
            ejected = _eject_ms(agent, f"gpu-{len(out):04d}")
            out.append(Round(hold, 1e3 * built, 1e3 * cpu, checks, exposed, ejected))
    finally:
        await agent.stop()
    return out


def _eject_ms(agent: ZoneAgent, gpu_id: str) -> float:
    """Failures in a row until ``gpu_id`` is ejected, as the data path records them;
    then the time the agent takes to put it out of its view (0: not ejected)."""
    from zone_agent.health import Outcome

    for _ in range(2 * agent.health.config.consecutive_failures):
        if agent.health.record(gpu_id, Outcome.TIMEOUT, time.monotonic()):
            started = time.perf_counter()
            agent.on_ejection(gpu_id)
            return 1e3 * (time.perf_counter() - started)
    return 0.0


def _measure(workers: int, rounds: int) -> list[Round]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8 * workers + 1024)), hard))
    server = _server()
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        from zone_agent.loop import run

        return run(_rounds(port, workers, rounds))  # the agent's own loop (uvloop if here)
    finally:
        _stop(server)


def _server() -> subprocess.Popen[str]:
    """The canned /metrics server (its first stdout line: its port)."""
    return subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )


def _stop(server: subprocess.Popen[str]) -> None:
    assert server.stdin is not None
    server.stdin.close()
    server.wait(timeout=10)


def _elsewhere(tree: Path, workers: int, rounds: int) -> list[Round]:
    """The same measurement with another checkout's code (its own interpreter run)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--json", "--workers", str(workers), "--rounds", str(rounds)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return [Round(**r) for r in json.loads(done.stdout.splitlines()[-1])]


def _median(rounds: list[Round], field: str) -> float:
    return float(statistics.median(float(getattr(r, field)) for r in rounds))


def _row(label: str, rounds: list[Round]) -> str:
    # The first round opens the connections; it is reported apart from the rest.
    warm = rounds[1:] or rounds
    return (
        f"  {label:9} hold: median {_median(warm, 'hold_ms'):7.2f} ms, worst "
        f"{max(r.hold_ms for r in warm):7.2f} ms | rebuild {_median(warm, 'rebuild_ms'):6.2f} ms "
        f"| CPU per round {_median(warm, 'cpu_ms'):7.1f} ms "
        f"| health checks' hold {_median(warm, 'check_hold_ms'):6.2f} ms "
        f"| own /metrics' hold {_median(warm, 'metrics_hold_ms'):6.2f} ms "
        f"| an ejection's hold {_median(warm, 'eject_ms'):6.2f} ms "
        f"(first round: hold {rounds[0].hold_ms:.1f} ms, CPU {rounds[0].cpu_ms:.0f} ms)"
    )


# ------------------------------------------------- requests through a large zone's agent


async def _latencies(
    port: int, workers: int, baseline: Path | None, repeat: int, seconds: int
) -> dict[str, list[tuple[float, float]]]:
    """``gtm zone`` (and a baseline checkout's) fronting ``workers`` canned workers (model
    ``canned``: scraped, health-checked, never sent a request) and one emulated H100
    that serves every request: wrk at concurrency 1 measures what a client sees while
    the agent scrapes the zone every 250 ms. Also the agent with the H100 alone (the
    floor). Paths take turns; each gives (p50, p99) per turn."""
    import tempfile

    from bench.zone_proxy import (
        SPEEDUP,
        WORKER_ARGS,
        WrkClient,
        body_json,
        find_binary,
        start_agent,
    )
    from gtm.testing.processes import start_listening

    wrk = find_binary("wrk")
    if wrk is None:
        raise SystemExit("--requests needs wrk (Debian: apt-get install -y wrk)")
    gpu = await start_listening([*WORKER_ARGS, "--speedup", str(SPEEDUP), "--seed", "1"])
    canned: list[str] = []
    for i in range(workers):
        canned += [
            "--worker",
            f"http://127.0.0.1:{port}/w{i},gpu=H100,id=canned-{i:04d},model=canned",
        ]

    paths: dict[str, tuple[list[str], Path | None]] = {"alone": ([], None)}
    if baseline is not None:
        paths["baseline"] = (canned, baseline)
    paths["gtm"] = (canned, None)
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    agents: dict[str, GtmProcess] = {}
    try:
        for name, (zone, tree) in paths.items():
            # (bench/zone_proxy.py's agent: the H100 as gpu-0, the canned workers added.)
            agents[name] = await start_agent([gpu.url], "uvloop", tree, zone)
        with tempfile.TemporaryDirectory(prefix="gtm-bench-round-") as tmp:
            client = WrkClient(wrk, Path(tmp), body_json(0))
            for running in agents.values():
                await client.run(running.url, 1, 1)  # warm up
            for turn in range(repeat):
                for name, running in agents.items():
                    got = await client.run(running.url, 1, seconds)
                    out[name].append((got.p50_s, got.p99_s))
                    print(
                        f"  turn {turn + 1}: {name:9} p50 {1e3 * got.p50_s:5.2f} ms, "
                        f"p99 {1e3 * got.p99_s:6.2f} ms, {got.requests / got.seconds:6.0f} req/s",
                        flush=True,
                    )
    finally:
        for running in (*agents.values(), gpu):
            await running.stop()
    return out


def _requests(workers: int, baseline: Path | None, repeat: int, seconds: int) -> None:
    server = _server()
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        print(
            f"requests through an agent fronting {workers:,} workers (wrk, concurrency 1, "
            f"{seconds} s per turn; 'alone': the agent with its one serving GPU only):"
        )
        out = asyncio.run(_latencies(port, workers, baseline, repeat, seconds))
    finally:
        _stop(server)
    for name, figures in out.items():
        p50 = statistics.median(f[0] for f in figures)
        p99 = statistics.median(f[1] for f in figures)
        print(f"  {name:9} median of turns: p50 {1e3 * p50:.2f} ms, p99 {1e3 * p99:.2f} ms")


def _ring_ms(workers: int, repeat: int) -> tuple[float, float, bool]:
    """A GPU joins a zone of ``workers``: its ring made by the reference form (every GPU
    hashed again, as before) and by the builder's (the new GPU hashed, points merged)."""
    from zone_agent.view import _ring, _ring_of, _vnodes

    ids = [f"gpu-{i:04d}" for i in range(workers)]
    kept = {i: _vnodes(i) for i in ids[:-1]}
    best = [float("inf"), float("inf")]
    same = True
    for _ in range(repeat):
        started = time.perf_counter()
        reference = _ring(ids)
        best[0] = min(best[0], time.perf_counter() - started)
        started = time.perf_counter()
        joined = _ring_of([kept[i] if i in kept else _vnodes(i) for i in ids])
        best[1] = min(best[1], time.perf_counter() - started)
        same &= bool((reference[0] == joined[0]).all() and (reference[1] == joined[1]).all())
    return 1e3 * best[0], 1e3 * best[1], same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="16 workers, 2 rounds (CI)")
    parser.add_argument("--workers", type=int, action="append", help="zone size (repeatable)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds per measurement")
    parser.add_argument("--repeat", type=int, default=2, help="measurements per size")
    parser.add_argument("--baseline", type=Path, help="a checkout of an earlier version")
    parser.add_argument(
        "--requests",
        action="store_true",
        help="also: requests through an agent fronting the largest zone (needs wrk)",
    )
    parser.add_argument("--seconds", type=int, default=8, help="per wrk turn (--requests)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return 0
    sizes = tuple(args.workers or ((16,) if args.smoke else SIZES))
    rounds = 2 if args.smoke else args.rounds
    repeat = 1 if args.smoke else args.repeat
    if args.json:
        print(json.dumps([r.__dict__ for r in _measure(sizes[0], rounds)]))
        return 0
    ok = True
    for workers in sizes:
        print(f"{workers:,} workers, {rounds} rounds, {repeat} measurements:")
        ours: list[Round] = []
        theirs: list[Round] = []
        for _ in range(repeat):
            if args.baseline is not None:
                base = _elsewhere(args.baseline, workers, rounds)
                theirs += base[1:]
                print(_row("baseline", base))
            mine = _measure(workers, rounds)
            ours += mine[1:]
            print(_row("gtm", mine))
            ok &= all(r.rebuild_ms > 0 and r.cpu_ms > 0 for r in mine)
        whole, joined, same = _ring_ms(workers, repeat)
        ok &= same
        print(
            f"  a GPU joins: the hash ring made in {joined:.1f} ms (each GPU's points kept), "
            f"against {whole:.1f} ms hashing every GPU again ({whole / joined:.0f} ×)"
        )
        if theirs:
            ratio = {f: _median(ours, f) / _median(theirs, f) for f in Round.__dataclass_fields__}
            print(
                f"  gtm / baseline: hold {ratio['hold_ms']:.2f} ×, rebuild "
                f"{ratio['rebuild_ms']:.2f} ×, CPU {ratio['cpu_ms']:.2f} ×, health checks' hold "
                f"{ratio['check_hold_ms']:.2f} ×, own /metrics' hold "
                f"{ratio['metrics_hold_ms']:.2f} ×, an ejection's hold {ratio['eject_ms']:.2f} ×"
            )
    if args.requests and not args.smoke:
        _requests(max(sizes), args.baseline, max(repeat, 2), args.seconds)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

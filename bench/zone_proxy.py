"""The zone agent as a proxy, against the routers operators run and nginx, in front of
the same emulated workers.

Four ``gtm gpu-sim`` worker processes (H100 profile, ``--speedup`` 10⁶ so a 1-token
answer costs the worker almost nothing but HTTP) sit behind, in the same run:

* **direct** — the client talks to one worker itself (the floor);
* **agent** — ``gtm zone`` (one process, default profile, every request tokenized,
  decided, charged, proxied with keep-alive pooling and written to the access log) on
  uvloop; ``--with-asyncio`` adds **agent-asyncio**, the same on asyncio's own loop
  (the fallback where uvloop is not installed); ``--with-admission`` adds
  **agent-admission**, the agent with flow control on (``--admission slo``: what
  holding requests for the SLO costs per request when none waits); ``--baseline
  DIR`` adds **agent-base**, the agent of another checkout (old vs new in the same
  run);
* **sglang-router** and **vllm-router** — SGLang's model gateway and vLLM's router
  (Rust; the ``bench-peers`` extra, started by :mod:`bench.peers`) with their default
  policy and settings;
* **nginx** — Debian's nginx with one worker process, ``least_conn`` upstream with
  ``keepalive 64``, ``proxy_buffering off`` (as for SSE).

Each path is driven by closed-loop clients at each ``--concurrency`` (default 1, 16
and 64) in short slices (1 s) that take turns between the paths, so that the load of
other jobs on a shared machine falls on each path alike; ``--repeat`` repetitions rotate
the order of the paths. Per path and concurrency: latency p50/p99 (the median over the
slices of each slice's percentile), the *added* latency (minus the direct path's, same
repetition), requests/s, and the proxy's own CPU time per request (``/proc/PID/stat``,
user + system, every thread; nginx: master and workers), and the workers' CPU time per
request behind it (their renderer processes included: a proxy that costs the workers
more leaves the shared machine fewer cycles). The agent's CPU includes its
background work in that time (scrapes every 250 ms, health checks). Other figures are
ranges over the repetitions.

The client is ``wrk`` (C, closed loop, as the issue's figures were taken; Debian:
``apt-get install -y wrk``): it shares the machine's CPUs with the proxies but costs
each path the same, and far less than a Python client would. Without wrk, ``--smoke``
falls back to a Python (aiohttp) client. On a shared, busy machine requests/s swing
with the other jobs; CPU per request much less: it is the robust figure.

``--stream N`` sends streamed requests of N tokens instead (workers at a speedup of
50, so each token reaches the proxy in a read of its own, as from an engine): what a
proxy costs per token relayed, the part of its CPU that grows with the answers' length.
It has no target.

Targets (issue 26), against sglang-router: requests/s ≥ 1× at each concurrency (the
median of the ratios over pairs of adjacent slices), added p50 at concurrency 1 ≤
sglang-router's, CPU per request ≤ sglang-router's. Issue 5's, against nginx: added
p50 < 1 ms at concurrency 1, requests/s ≥ 0.5× nginx's.

    python bench/zone_proxy.py                   # full run (~5 min)
    python bench/zone_proxy.py --baseline ../old # also the agent of another checkout
    python bench/zone_proxy.py --smoke           # a few seconds; skips what is missing
    python bench/zone_proxy.py --stream 200      # streamed answers: CPU per token relayed

Needs (full run): ``wrk`` and ``nginx`` on PATH (or in /usr/sbin), and the peers
(``pip install -e '.[bench-peers]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiohttp

# Run as a script, sys.path starts at bench/, not at the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import POLICIES, Peer, PeerMissing, PeerRouter, require, start_peer, version
from gtm import native
from gtm.gpu_profiles import LLAMA_8B
from gtm.net import free_port
from gtm.stats import percentile
from gtm.testing.processes import STARTUP_TIMEOUT_S, cpu_seconds, start_listening
from gtm.testing.processes import GtmProcess as Process
from gtm.testing.processes import tree as process_tree

#: Issue 26 measures the proxies "with one fast worker". More workers (``--workers``) give
#: the decision candidates, but on a shared 2-core machine they also reward a router that
#: piles every request on one of them: sglang-router's cache_aware sends all of this
#: bench's identical prompts to one worker, whose process then answers several requests
#: per wake-up and costs the machine less per request than four half-idle ones (the
#: report prints each worker's share of the requests).
WORKERS = 1
CHAT = "/v1/chat/completions"
BODY_JSON = (
    '{"model":"' + LLAMA_8B + '","messages":[{"role":"user","content":'
    '"Hello, how are you today?"}],"max_tokens":1}'
)
#: One emulated worker (its seed and speedup are added).
WORKER_ARGS = (*("gpu-sim", "--port", "0", "--gpu-type", "H100"), "--warmup-passes", "0")
#: A 1-token answer costs the worker almost nothing.
SPEEDUP = 1_000_000
#: With ``--stream N``: decode steps 1/50 of a real H100's, so the tokens of a stream
#: reach the proxy one chunk per read, as from a real engine, not coalesced.
STREAM_SPEEDUP = 50


def body_json(stream_tokens: int) -> str:
    """The request every path is sent: :data:`BODY_JSON`, or with ``stream_tokens`` > 0
    a streamed answer of that many tokens (``ignore_eos``)."""
    if stream_tokens <= 0:
        return BODY_JSON
    return BODY_JSON.replace(
        '"max_tokens":1}', f'"max_tokens":{stream_tokens},"ignore_eos":true,"stream":true}}'
    )


CONCURRENCY = (1, 16, 64)
#: Length of one slice, s (the paths take turns slice by slice; wrk counts whole seconds).
SLICE_S = 1
#: Issue 5's targets, against nginx.
TARGET_ADDED_P50_S = 1e-3
TARGET_NGINX_RATIO = 0.5
#: Issue 26's: at least sglang-router's requests/s, at most its added p50 and CPU.
REFERENCE = Peer.SGLANG.value
TARGET_REFERENCE_RATIO = 1.0

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream workers {{
        least_conn;
{servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://workers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""

#: wrk's script: the chat request, and one result line when done (latencies in µs).
WRK_SCRIPT = """\
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("GTM-BENCH %d %d %.1f %.1f %d\\n", summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
"""
_WRK_RESULT = re.compile(r"GTM-BENCH (\d+) (\d+) ([\d.]+) ([\d.]+) (\d+)")


def find_binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for d in ("/usr/sbin", "/usr/local/sbin") if Path(p := f"{d}/{name}").exists()),
        None,
    )


# ---------------------------------------------------------------------------- clients


@dataclass(frozen=True, slots=True)
class Slice:
    """One closed-loop run against one path."""

    requests: int
    seconds: float
    p50_s: float
    p99_s: float


class Client(Protocol):
    name: str

    async def run(self, url: str, concurrency: int, seconds: int) -> Slice: ...


class WrkClient:
    """``wrk`` with the chat request (one or two threads)."""

    name = "wrk"

    def __init__(self, wrk: str, directory: Path, body: str) -> None:
        self._wrk = wrk
        self._script = directory / "chat.lua"
        self._script.write_text(WRK_SCRIPT.format(body=body))

    async def run(self, url: str, concurrency: int, seconds: int) -> Slice:
        args = [self._wrk, f"-t{min(2, concurrency)}", f"-c{concurrency}", f"-d{seconds}s"]
        args += ["--timeout", "10s", "-s", str(self._script), url + CHAT]
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out = (await proc.communicate())[0].decode(errors="replace")
        match = _WRK_RESULT.search(out)
        if match is None:
            raise SystemExit(f"wrk against {url} printed no result:\n{out}")
        requests, micros, p50, p99, errors = match.groups()
        if int(errors):
            raise SystemExit(f"{url}: {errors} failed requests (non-2xx or socket errors)")
        return Slice(int(requests), int(micros) / 1e6, float(p50) / 1e6, float(p99) / 1e6)


class PythonClient:
    """An aiohttp closed loop (the fallback when wrk is missing; it costs the machine
    more CPU per request than any proxy here)."""

    name = "python (aiohttp)"

    def __init__(self, http: aiohttp.ClientSession, body: str) -> None:
        self._http = http
        self._body = body

    async def run(self, url: str, concurrency: int, seconds: int) -> Slice:
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        headers = {"Content-Type": "application/json"}

        async def loop() -> None:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                async with self._http.post(url + CHAT, data=self._body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise SystemExit(f"{url}: HTTP {r.status}")
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(loop())
        elapsed = time.perf_counter() - start
        return Slice(
            len(latencies), elapsed, percentile(latencies, 0.5), percentile(latencies, 0.99)
        )


# ---------------------------------------------------------------------------- paths


@dataclass(frozen=True, slots=True)
class Target:
    """A path under test: its URL and the processes whose CPU is the proxy's."""

    name: str
    url: str
    pids: tuple[int, ...] = ()


def cpu_seconds_of(pids: Sequence[int]) -> float:
    """User + system CPU time of these processes so far (every one must be running)."""
    return sum(cpu_seconds(pid) for pid in pids)


def write_nginx_conf(prefix: Path, workers: Sequence[str], port: int) -> Path:
    """nginx's configuration and temp directories under ``prefix`` (writable by its
    worker, which may run as another user)."""
    prefix.chmod(0o777)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / sub).mkdir(mode=0o777, exist_ok=True)
    servers = "\n".join(f"        server {w.removeprefix('http://')};" for w in workers)
    conf = prefix / "nginx.conf"
    conf.write_text(NGINX_CONF.format(prefix=prefix, servers=servers, port=port))
    return conf


async def start_nginx(nginx: str, workers: Sequence[str], prefix: Path) -> Process:
    port = free_port("127.0.0.1")
    conf = write_nginx_conf(prefix, workers, port)
    proc = await asyncio.create_subprocess_exec(
        nginx, "-p", str(prefix), "-c", str(conf), stderr=asyncio.subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                async with http.get(url + "/health") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline or proc.returncode is not None:
                raise SystemExit(f"nginx did not start (see {prefix}/error.log)")
            await asyncio.sleep(0.05)
    return Process(proc, url)


async def start_agent(
    urls: Sequence[str], loop: str, tree: Path | None = None, extra: Sequence[str] = ()
) -> Process:
    """``gtm zone`` in front of ``urls``, with ``extra`` arguments; ``tree``: run another
    checkout's code (its directory first on ``PYTHONPATH``, with its compiled modules in
    place)."""
    args = ["zone", "--zone", "bench-a", "--region", "bench", *extra]
    args += ["--listen", f"127.0.0.1:{free_port('127.0.0.1')}", "--event-loop", loop]
    for i, url in enumerate(urls):
        args += ["--worker", f"{url},gpu=H100,id=gpu-{i}"]
    if tree is None:
        return await start_listening(args)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return await start_listening(args, env=env, cwd=str(tree))


# ---------------------------------------------------------------------------- measuring


@dataclass(frozen=True, slots=True)
class Figures:
    """One path at one concurrency in one repetition."""

    rps: float
    p50_s: float
    p99_s: float
    #: The proxy's CPU seconds per request (None: the direct path).
    cpu_s: float | None
    #: The workers' CPU seconds per request (renderer processes included): what the
    #: path costs the machine beyond the proxy, so a requests/s gap at equal proxy CPU
    #: can be told from the way a proxy uses the workers.
    workers_cpu_s: float
    #: Each worker's share of the requests the path served (from the workers' own
    #: counters).
    shares: tuple[float, ...]
    #: Requests/s of each slice, in order (paired with other paths' slices).
    slices: tuple[float, ...]


Round = dict[tuple[str, int], Figures]


async def measure_round(
    client: Client,
    targets: Sequence[Target],
    concurrencies: Sequence[int],
    slices: int,
    order: int,
    workers: Sequence[int],
    served: Callable[[], Awaitable[list[int]]],
) -> Round:
    # Rotate the order each repetition, so no path always runs first (or last).
    k = order % len(targets)
    names = [*targets[k:], *targets[:k]]
    out: Round = {}
    worker_count = len(await served())
    for concurrency in concurrencies:
        runs: dict[str, list[Slice]] = {t.name: [] for t in names}
        cpu = dict.fromkeys(runs, 0.0)
        behind = dict.fromkeys(runs, 0.0)
        per_worker = {name: [0] * worker_count for name in runs}
        for _ in range(slices):
            for target in names:
                counted = await served()
                before, before_workers = cpu_seconds_of(target.pids), cpu_seconds_of(workers)
                runs[target.name].append(await client.run(target.url, concurrency, SLICE_S))
                cpu[target.name] += cpu_seconds_of(target.pids) - before
                behind[target.name] += cpu_seconds_of(workers) - before_workers
                now = [b - a for a, b in zip(counted, await served(), strict=True)]
                per_worker[target.name] = [
                    a + b for a, b in zip(per_worker[target.name], now, strict=True)
                ]
        for target in names:
            done = runs[target.name]
            requests = sum(s.requests for s in done)
            out[target.name, concurrency] = Figures(
                rps=requests / sum(s.seconds for s in done),
                p50_s=statistics.median(s.p50_s for s in done),
                p99_s=statistics.median(s.p99_s for s in done),
                cpu_s=cpu[target.name] / max(1, requests) if target.pids else None,
                workers_cpu_s=behind[target.name] / max(1, requests),
                shares=tuple(
                    n / max(1, sum(per_worker[target.name])) for n in per_worker[target.name]
                ),
                slices=tuple(s.requests / s.seconds for s in done),
            )
    return out


_SUCCESS = re.compile(rb"^vllm:request_success_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


async def served_counts(http: aiohttp.ClientSession, urls: Sequence[str]) -> list[int]:
    """Each worker's finished requests, from its own counter (vLLM's
    ``vllm:request_success_total``, summed over finish reasons)."""
    counts = []
    for url in urls:
        async with http.get(url + "/metrics") as response:
            text = await response.read()
        counts.append(round(sum(float(v) for v in _SUCCESS.findall(text))))
    return counts


async def warm_up(client: Client, targets: Sequence[Target], concurrencies: Sequence[int]) -> None:
    """Pools, caches and code paths: one slice per path and concurrency."""
    for target in targets:
        for concurrency in concurrencies:
            await client.run(target.url, concurrency, SLICE_S)


# ---------------------------------------------------------------------------- the run


@dataclass
class Setup:
    smoke: bool
    workers: int
    concurrencies: tuple[int, ...]
    repeat: int
    baseline: Path | None
    with_asyncio: bool
    with_admission: bool = False
    #: Tokens per streamed answer (0: the one-token, unstreamed answer of the targets).
    stream_tokens: int = 0


async def start_peers(urls: Sequence[str], smoke: bool, notes: list[str]) -> list[PeerRouter]:
    routers = []
    for peer in Peer:
        try:
            require(peer)
        except PeerMissing as exc:
            if not smoke:
                raise SystemExit(str(exc)) from None
            notes.append(f"{peer.value} not installed: not run (smoke mode)")
            continue
        routers.append(await start_peer(peer, POLICIES[peer][0], urls))
    return routers


async def run(setup: Setup) -> int:
    wrk, nginx = find_binary("wrk"), find_binary("nginx")
    missing = [name for name, path in (("wrk", wrk), ("nginx", nginx)) if path is None]
    if missing and not setup.smoke:
        print(f"not found: {', '.join(missing)} (Debian: apt-get install -y {' '.join(missing)})")
        return 2
    notes: list[str] = []
    speedup = STREAM_SPEEDUP if setup.stream_tokens > 0 else SPEEDUP
    workers = [
        await start_listening([*WORKER_ARGS, "--speedup", str(speedup), "--seed", str(i)])
        for i in range(setup.workers)
    ]
    urls = [w.url for w in workers]
    procs: list[Process] = list(workers)
    routers: list[PeerRouter] = []
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="gtm-bench-proxy-") as tmp:
        try:
            targets = [Target("direct", urls[0])]
            agents: dict[str, tuple[str, Path | None, tuple[str, ...]]] = {
                "agent": ("uvloop", None, ())
            }
            if setup.baseline is not None:
                agents["agent-base"] = ("uvloop", setup.baseline, ())
            if setup.with_asyncio:
                agents["agent-asyncio"] = ("asyncio", None, ())
            if setup.with_admission:
                agents["agent-admission"] = ("uvloop", None, ("--admission", "slo"))
            for name, (loop, tree, extra) in agents.items():
                procs.append(await start_agent(urls, loop, tree, extra))
                targets.append(Target(name, procs[-1].url, (procs[-1].proc.pid,)))
            routers = await start_peers(urls, setup.smoke, notes)
            targets += [Target(r.peer.value, r.url, (r.pid,)) for r in routers]
            if nginx is not None:
                (Path(tmp) / "nginx").mkdir()
                procs.append(await start_nginx(nginx, urls, Path(tmp) / "nginx"))
                pids = tuple(process_tree(procs[-1].proc.pid))
                targets.append(Target("nginx", procs[-1].url, pids))
            else:
                notes.append("nginx not found: not run (smoke mode)")
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=max(setup.concurrencies))
            ) as http:
                body = body_json(setup.stream_tokens)
                client: Client = (
                    WrkClient(wrk, Path(tmp), body) if wrk else PythonClient(http, body)
                )
                if wrk is None:
                    notes.append("wrk not found: a Python client drove the load (smoke mode)")
                await warm_up(client, targets, setup.concurrencies)
                slices = 1 if setup.smoke else 4
                for k in range(setup.repeat):
                    # Read each round: a worker's renderer process may have been replaced.
                    worker_pids = [pid for w in workers for pid in process_tree(w.proc.pid)]
                    rounds.append(
                        await measure_round(
                            client,
                            targets,
                            setup.concurrencies,
                            slices,
                            k,
                            worker_pids,
                            lambda: served_counts(http, urls),
                        )
                    )
                    print(f"  repetition {k + 1}/{setup.repeat} done", file=sys.stderr, flush=True)
        finally:
            for router in routers:
                await router.stop()
            for proc in reversed(procs):
                await proc.stop()
    report([t.name for t in targets], rounds, setup, client.name, notes)
    return 0


# ---------------------------------------------------------------------------- report


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """``low–high`` of the repetitions' values (one value: just it)."""
    low, high = min(values), max(values)
    return fmt(low) if len(values) == 1 else f"{fmt(low)}–{fmt(high)}"


def _ratio(x: float) -> str:
    return f"{x:.2f}"


def _tenths(x: float) -> str:
    return f"{x:.1f}"


def _count(x: float) -> str:
    return f"{x:,.0f}"


def paired(rounds: Sequence[Round], a: str, b: str, concurrency: int) -> list[float]:
    """``a``'s requests/s over ``b``'s in each pair of adjacent slices, all repetitions."""
    return [
        x / y
        for r in rounds
        for x, y in zip(r[a, concurrency].slices, r[b, concurrency].slices, strict=True)
        if y
    ]


def report(
    names: Sequence[str], rounds: Sequence[Round], setup: Setup, client: str, notes: list[str]
) -> None:
    print(
        f"zone agent vs peers, {setup.workers} emulated H100 worker(s), client {client}, "
        f"{len(rounds)} repetition(s), ranges over repetitions "
        f"({'smoke' if setup.smoke else 'full'})"
    )
    # The agent's interpreter is this one (the venv's): its build moves the agent's CPU.
    print(f"agent on {native.interpreter()}")
    for concurrency in setup.concurrencies:
        print(f"\nconcurrency {concurrency}")
        print(
            f"{'path':>14} {'p50 ms':>13} {'p99 ms':>15} {'added p50':>13} {'added p99':>15}"
            f" {'req/s':>13} {'CPU µs/req':>11} {'workers µs/req':>15}"
        )
        for name in names:
            got = [r[name, concurrency] for r in rounds]
            base = [r["direct", concurrency] for r in rounds]
            cpu = [g.cpu_s * 1e6 for g in got if g.cpu_s is not None]
            print(
                f"{name:>14} {span([g.p50_s for g in got], ms):>13}"
                f" {span([g.p99_s for g in got], ms):>15}"
                f" {span([g.p50_s - d.p50_s for g, d in zip(got, base, strict=True)], ms):>13}"
                f" {span([g.p99_s - d.p99_s for g, d in zip(got, base, strict=True)], ms):>15}"
                f" {span([g.rps for g in got], _count):>13}"
                f" {span(cpu, _count) if cpu else '':>11}"
                f" {span([g.workers_cpu_s * 1e6 for g in got], _count):>15}"
            )
        if setup.workers > 1:
            print("  each worker's share of the requests (first repetition):")
            for name in names:
                shares = rounds[0][name, concurrency].shares
                print(f"{name:>14} " + " ".join(f"{x:4.0%}" for x in shares))
    agents = [n for n in names if n.startswith("agent")]
    if setup.stream_tokens > 0:
        # The targets are for one-token answers; a stream's figure is the relay's
        # cost per token, against every proxy that ran.
        print(f"\nCPU µs per streamed token ({setup.stream_tokens} tokens per answer):")
        for concurrency in setup.concurrencies:
            per_token = {
                name: [
                    g.cpu_s * 1e6 / setup.stream_tokens
                    for r in rounds
                    if (g := r[name, concurrency]).cpu_s is not None
                ]
                for name in names
            }
            print(
                f"  concurrency {concurrency}: "
                + ", ".join(f"{n} {span(v, _tenths)}" for n, v in per_token.items() if v)
            )
        agents = []
    for agent in agents:
        print()
        if REFERENCE in names:
            verdicts_vs_reference(agent, rounds, setup.concurrencies)
        if "nginx" in names:
            verdicts_vs_nginx(agent, rounds, setup.concurrencies)
    if "agent-base" in names:
        print()
        for concurrency in setup.concurrencies:
            cpu = [
                new / old
                for r in rounds
                if (new := r["agent", concurrency].cpu_s) is not None
                and (old := r["agent-base", concurrency].cpu_s)
            ]
            rate = paired(rounds, "agent", "agent-base", concurrency)
            print(
                f"agent vs agent-base at concurrency {concurrency}: CPU per request "
                f"{span(cpu, _ratio)} ×, requests/s median {statistics.median(rate):.2f} × "
                f"(paired slices {span(rate, _ratio)})"
            )
    for note in notes:
        print(note)


def verdicts_vs_reference(
    agent: str, rounds: Sequence[Round], concurrencies: Sequence[int]
) -> None:
    """Issue 26's targets: requests/s, added p50 (concurrency 1) and CPU per request
    against sglang-router's."""
    for concurrency in concurrencies:
        rate = paired(rounds, agent, REFERENCE, concurrency)
        median = statistics.median(rate)
        met = "met" if median >= TARGET_REFERENCE_RATIO else "MISSED"
        print(
            f"target: {agent} requests/s ≥ 1 × {REFERENCE}'s at concurrency {concurrency}: "
            f"median {median:.2f} × over {len(rate)} paired slices "
            f"(range {span(rate, _ratio)}), {met}"
        )
    lowest = min(concurrencies)
    ours = [r[agent, lowest].p50_s - r["direct", lowest].p50_s for r in rounds]
    theirs = [r[REFERENCE, lowest].p50_s - r["direct", lowest].p50_s for r in rounds]
    met = "met" if statistics.median(ours) <= statistics.median(theirs) else "MISSED"
    print(
        f"target: {agent} added p50 ≤ {REFERENCE}'s at concurrency {lowest}: "
        f"{span(ours, ms)} ms vs {span(theirs, ms)} ms, {met}"
    )
    for concurrency in concurrencies:
        cpu = [
            ours_cpu / theirs_cpu
            for r in rounds
            if (ours_cpu := r[agent, concurrency].cpu_s) is not None
            and (theirs_cpu := r[REFERENCE, concurrency].cpu_s)
        ]
        met = "met" if cpu and statistics.median(cpu) <= 1.0 else "MISSED"
        print(
            f"target: {agent} CPU per request ≤ {REFERENCE}'s at concurrency {concurrency}: "
            f"{agent} / {REFERENCE} = {span(cpu, _ratio)} ×, {met}"
        )


def verdicts_vs_nginx(agent: str, rounds: Sequence[Round], concurrencies: Sequence[int]) -> None:
    """Issue 5's targets: added p50 < 1 ms at concurrency 1; requests/s ≥ 0.5 × nginx."""
    lowest = min(concurrencies)
    added = [r[agent, lowest].p50_s - r["direct", lowest].p50_s for r in rounds]
    met = sum(a < TARGET_ADDED_P50_S for a in added)
    print(
        f"target: {agent} added p50 < 1 ms at concurrency {lowest}: {span(added, ms)} ms, "
        f"met in {met}/{len(rounds)} repetitions"
    )
    rate = [x for c in concurrencies for x in paired(rounds, agent, "nginx", c)]
    median = statistics.median(rate)
    print(
        f"target: {agent} requests/s ≥ 0.5 × nginx's: median {median:.2f} × over "
        f"{len(rate)} paired slices (range {span(rate, _ratio)}), "
        f"{'met' if median >= TARGET_NGINX_RATIO else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run for CI")
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help=f"closed-loop clients (repeatable; default {', '.join(map(str, CONCURRENCY))})",
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="repetitions (default: 3; 1 with --smoke)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout whose agent runs beside this one's (agent-base)",
    )
    parser.add_argument(
        "--with-asyncio", action="store_true", help="also the agent on asyncio's own loop"
    )
    parser.add_argument(
        "--with-admission",
        action="store_true",
        help="also the agent with flow control on (--admission slo)",
    )
    parser.add_argument(
        "--stream",
        type=int,
        default=0,
        metavar="TOKENS",
        help="streamed answers of this many tokens (workers at speedup "
        f"{STREAM_SPEEDUP}, one chunk per read): the relay's CPU per token; no targets",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        help=f"emulated workers behind every path (default {WORKERS}, as issue 26 measures)",
    )
    args = parser.parse_args()
    concurrencies = tuple(args.concurrency or ((1, 16) if args.smoke else CONCURRENCY))
    setup = Setup(
        smoke=args.smoke,
        workers=args.workers,
        concurrencies=concurrencies,
        repeat=args.repeat or (1 if args.smoke else 3),
        baseline=args.baseline.resolve() if args.baseline else None,
        with_asyncio=args.with_asyncio,
        with_admission=args.with_admission,
        stream_tokens=args.stream,
    )
    for peer in Peer:
        if version(peer):
            print(f"{peer.value} {version(peer)}", file=sys.stderr)
    sys.exit(asyncio.run(run(setup)))


if __name__ == "__main__":
    main()

"""The zone agent as a proxy, against nginx, in front of the same emulated workers.

Four ``gtm gpu-sim`` worker processes (H100 profile, ``--speedup`` 10⁶ so a 1-token
answer costs the worker almost nothing but HTTP) sit behind, in the same run:

* **direct** — the client spreads requests over the workers itself (the floor);
* **agent** — ``gtm zone`` (one process, default profile, every request tokenized,
  decided, charged and proxied with keep-alive pooling) on uvloop;
* **agent-asyncio** — the same on asyncio's own event loop (``--event-loop asyncio``,
  the fallback where uvloop is not installed);
* **nginx** — Debian's nginx with as many worker processes as the agent has (one),
  ``least_conn`` upstream with ``keepalive 64``, ``proxy_buffering off`` (as for SSE).

Latency: sequential requests (one in flight); the *added* latency of a proxy is its p50
(p99) minus the direct p50 (p99) of the same repetition. Throughput: a closed loop of
``--concurrency`` clients, in requests/s, measured in short slices (1 s) that take turns
between the paths, so that the load of other jobs on a shared machine falls on each path
alike; the ratio agent / nginx is taken per pair of adjacent slices, and the verdict is
on the *median* of those ratios over all repetitions (their range is printed too).
Everything is warmed up first (sequential, then concurrent requests on every path), then
measured ``--repeat`` times with the order of the paths rotated; other figures are
printed as ranges over the repetitions. The client is Python
(aiohttp) on the same machine, so on a small box it shares the CPUs with the proxy
under test: compare the proxies with each other, not with other machines. Each proxy's
own CPU time per request in the throughput phase (``/proc/PID/stat``; nginx: master and
workers) is printed too: on a shared, busy machine requests/s swing with the other jobs,
CPU per request much less. The agent's includes its background work in that time
(scrapes every 250 ms, health checks), which weighs more the fewer requests it serves.

Issue 5 targets: added latency p50 < 1 ms; throughput ≥ 0.5 × nginx.

    python bench/zone_proxy.py           # full run (~2 min); fails if nginx is missing
    python bench/zone_proxy.py --smoke   # a few seconds; skips the nginx peer if absent

Needs: the ``nginx`` binary on PATH or in /usr/sbin (Debian: ``apt-get install -y nginx``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gtm.gpu_profiles import LLAMA_8B
from gtm.net import free_port
from gtm.stats import percentile
from gtm.testing.processes import STARTUP_TIMEOUT_S, start_listening
from gtm.testing.processes import GtmProcess as Process

WORKERS = 4
BODY = {
    "model": LLAMA_8B,
    "messages": [{"role": "user", "content": "Hello, how are you today?"}],
    "max_tokens": 1,
}
TARGET_ADDED_P50_S = 1e-3
TARGET_THROUGHPUT_RATIO = 0.5
#: Length of one throughput slice, s (the paths take turns slice by slice).
SLICE_S = 1.0

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


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )


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


async def latencies(http: aiohttp.ClientSession, urls: Sequence[str], count: int) -> list[float]:
    out = []
    for i in range(count):
        url = urls[i % len(urls)] + "/v1/chat/completions"
        start = time.perf_counter()
        async with http.post(url, json=BODY) as response:
            await response.read()
            if response.status != 200:
                raise SystemExit(f"{url}: HTTP {response.status}")
        out.append(time.perf_counter() - start)
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of these processes so far (``/proc/PID/stat``)."""
    total = 0
    for pid in pids:
        # Fields after the ")" closing the command name: utime and stime are the 12th
        # and 13th (proc(5): fields 14 and 15 of the line).
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def with_children(pid: int) -> list[int]:
    """``pid`` and its child processes (nginx's master and its workers)."""
    out = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(stat.parent.name))
    return out


async def throughput(
    http: aiohttp.ClientSession, urls: Sequence[str], concurrency: int, seconds: float
) -> tuple[float, int]:
    """Requests/s of a closed loop, and how many requests were done."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < deadline:
            async with http.post(urls[i % len(urls)] + "/v1/chat/completions", json=BODY) as r:
                await r.read()
                if r.status != 200:
                    raise SystemExit(f"HTTP {r.status}")
            done += 1
            i += 1

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for k in range(concurrency):
            group.create_task(client(k))
    return done / (time.perf_counter() - start), done


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """``low–high`` of the repetitions' values (one value: just it)."""
    low, high = min(values), max(values)
    return fmt(low) if len(values) == 1 else f"{fmt(low)}–{fmt(high)}"


async def start_agent(urls: Sequence[str], loop: str) -> Process:
    args = [
        "zone",
        "--zone",
        "bench-a",
        "--region",
        "bench",
        "--listen",
        f"127.0.0.1:{free_port('127.0.0.1')}",
        "--event-loop",
        loop,
    ]
    for i, url in enumerate(urls):
        args += ["--worker", f"{url},gpu=H100,id=gpu-{i}"]
    return await start_listening(args)


@dataclass
class Round:
    """One repetition's figures per target."""

    p50: dict[str, float]
    p99: dict[str, float]
    rps: dict[str, float]
    #: The proxy's own CPU time per request in the throughput phase, seconds.
    cpu: dict[str, float]
    #: Per agent, its requests/s over nginx's in each pair of adjacent slices.
    ratios: dict[str, list[float]]


async def measure_round(
    http: aiohttp.ClientSession,
    targets: dict[str, list[str]],
    count: int,
    seconds: float,
    concurrency: int,
    order: int,
    pids: dict[str, list[int]],
) -> Round:
    # Rotate the order each repetition, so no target always runs first (or last).
    names = list(targets)
    names = names[order % len(names) :] + names[: order % len(names)]
    p50, p99 = {}, {}
    for name in names:
        lat = await latencies(http, targets[name], count)
        p50[name], p99[name] = percentile(lat, 0.5), percentile(lat, 0.99)
    done = dict.fromkeys(names, 0)
    cpu_s = dict.fromkeys(names, 0.0)
    per_slice: dict[str, list[float]] = {name: [] for name in names}
    slices = max(1, round(seconds / SLICE_S))
    for _ in range(slices):
        for name in names:
            before = cpu_seconds(pids[name]) if name in pids else 0.0
            rate, n = await throughput(http, targets[name], concurrency, seconds / slices)
            per_slice[name].append(rate)
            done[name] += n
            if name in pids:
                cpu_s[name] += cpu_seconds(pids[name]) - before
    rps = {name: statistics.fmean(per_slice[name]) for name in names}
    cpu = {name: cpu_s[name] / max(1, done[name]) for name in names if name in pids}
    ratios = {
        agent: [a / b for a, b in zip(per_slice[agent], per_slice["nginx"], strict=True) if b]
        for agent in AGENTS
        if "nginx" in per_slice and agent in per_slice
    }
    return Round(p50, p99, rps, cpu, ratios)


async def run(smoke: bool, concurrency: int, repeat: int) -> int:
    nginx = find_nginx()
    if nginx is None and not smoke:
        print("nginx not found: install it (Debian: apt-get install -y nginx)", file=sys.stderr)
        return 2
    count = 100 if smoke else 1_000
    seconds = 1.0 if smoke else 4.0
    workers = [
        await start_listening(
            [
                "gpu-sim",
                "--port",
                "0",
                "--gpu-type",
                "H100",
                "--speedup",
                "1000000",
                "--warmup-passes",
                "0",
                "--seed",
                str(i),
            ]
        )
        for i in range(WORKERS)
    ]
    urls = [w.url for w in workers]
    procs = list(workers)
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="gtm-bench-nginx-") as tmp:
        try:
            targets: dict[str, list[str]] = {"direct": urls}
            pids: dict[str, list[int]] = {}
            for name, loop in AGENTS.items():
                agent = await start_agent(urls, loop)
                procs.append(agent)
                targets[name] = [agent.url]
                pids[name] = [agent.proc.pid]
            if nginx is not None:
                procs.append(await start_nginx(nginx, urls, Path(tmp)))
                targets["nginx"] = [procs[-1].url]
                pids["nginx"] = with_children(procs[-1].proc.pid)
            connector = aiohttp.TCPConnector(limit=concurrency)
            async with aiohttp.ClientSession(connector=connector) as http:
                # Warm up pools, caches and code paths: sequential, then concurrent.
                for target in targets.values():
                    await latencies(http, target, 20 if smoke else 200)
                    await throughput(http, target, concurrency, 0.2 if smoke else 1.0)
                for k in range(repeat):
                    rounds.append(
                        await measure_round(http, targets, count, seconds, concurrency, k, pids)
                    )
                    print(f"  repetition {k + 1}/{repeat} done", file=sys.stderr, flush=True)
        finally:
            for proc in reversed(procs):
                await proc.stop()
    report(targets, rounds, smoke)
    return 0


#: The agents measured: gtm zone on uvloop (what it runs when installed) and on
#: asyncio's own loop (the fallback).
AGENTS = {"agent": "uvloop", "agent-asyncio": "asyncio"}


def report(targets: dict[str, list[str]], rounds: list[Round], smoke: bool) -> None:
    print(
        f"zone agent vs nginx, {WORKERS} emulated H100 workers, one process each "
        f"(gtm zone; nginx worker_processes 1), {len(rounds)} repetition(s), "
        f"ranges over repetitions ({'smoke' if smoke else 'full'})"
    )
    print(
        f"{'path':>14} {'p50 ms':>13} {'p99 ms':>13} {'added p50':>13} {'added p99':>13}"
        f" {'req/s':>13} {'CPU µs/req':>13}"
    )
    for name in targets:
        added50 = [r.p50[name] - r.p50["direct"] for r in rounds]
        added99 = [r.p99[name] - r.p99["direct"] for r in rounds]
        cpu = [r.cpu[name] * 1e6 for r in rounds if name in r.cpu]
        print(
            f"{name:>14} {span([r.p50[name] for r in rounds], ms):>13}"
            f" {span([r.p99[name] for r in rounds], ms):>13} {span(added50, ms):>13}"
            f" {span(added99, ms):>13} {span([r.rps[name] for r in rounds], '{:,.0f}'.format):>13}"
            f" {span(cpu, '{:,.0f}'.format) if cpu else '':>13}"
        )
    for agent in AGENTS:
        added = [r.p50[agent] - r.p50["direct"] for r in rounds]
        met = sum(a < TARGET_ADDED_P50_S for a in added)
        print(
            f"target: {agent} added latency p50 < 1 ms: {span(added, ms)} ms, "
            f"met in {met}/{len(rounds)} repetitions"
        )
        if "nginx" in targets:
            ratios = [x for r in rounds for x in r.ratios.get(agent, [])]
            if ratios:
                median = statistics.median(ratios)
                verdict = "met" if median >= TARGET_THROUGHPUT_RATIO else "MISSED"
                print(
                    f"target: {agent} throughput ≥ 0.5 × nginx: median {median:.2f} × over "
                    f"{len(ratios)} paired slices (range {span(ratios, '{:.2f}'.format)}), "
                    f"{verdict}"
                )
            # CPU per request bounds a proxy's throughput per core, whatever the client
            # manages to send, and swings far less than requests/s on a busy machine.
            cpu = [r.cpu["nginx"] / r.cpu[agent] for r in rounds if r.cpu[agent] > 0]
            if cpu:
                print(
                    f"{agent} CPU per request vs nginx's: nginx / agent = "
                    f"{span(cpu, '{:.2f}'.format)} ×"
                )
    if "nginx" not in targets:
        print("nginx not found: the peer comparison was not run (smoke mode)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run for CI")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument(
        "--repeat", type=int, default=None, help="repetitions (default: 3; 1 with --smoke)"
    )
    args = parser.parse_args()
    repeat = args.repeat or (1 if args.smoke else 3)
    sys.exit(asyncio.run(run(args.smoke, args.concurrency, repeat)))


if __name__ == "__main__":
    main()

"""Fidelity of the fleet simulator: the same small scenario live and simulated.

Issue 10, item 6: 16 emulated GPUs (two regions × two zones × four GPUs serving
Llama-3.1-8B), the Mooncake conversation trace, emulated GPUs ``--speedup`` × faster
than real ones. The scenario runs

* **live**: ``gtm up`` (in-process, or ``--processes``: every tier and GPU its own OS
  process against etcd) on private loopback addresses, driven by ``gtm load`` (open
  loop, clients placed at the 500 largest cities, the load-test tenant without quotas);
* **simulated**: ``fleetsim.sim`` on exactly the same GPUs (ids, types, zones), the same
  requests at the same instants (``Trace.window``; sizes capped as ``gtm load`` caps
  them), the same client cities (``ClientSampler`` with the same seed) and policies —
  with time stretched by the speedup (simulated s = wall s × speedup, latencies divided
  back) and no network delay (loopback).

Printed: TTFT p50/p99, end-to-end p50/p99, success ratio and throughput (requests
completed per second) of both, and how far apart they are (target: within 10 %).

    python bench/sim_fidelity.py                 # 60 s of trace at ~50 % load
    python bench/sim_fidelity.py --processes     # live side as one process per tier
    python bench/sim_fidelity.py --smoke         # 10 s, a few seconds of set-up
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as a script, bench/ comes first on sys.path and bench/dns.py would shadow dnspython
# (gtm.up imports it).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from fleetsim.sim.fleet import FleetSpec, fleet_from_topology  # noqa: E402
from fleetsim.sim.policies import policy  # noqa: E402
from fleetsim.sim.simulator import Simulator, Status  # noqa: E402
from fleetsim.sim.workload import SimRequest, fleet_capacity_rps  # noqa: E402
from fleetsim.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceKind, load_trace  # noqa: E402
from gtm.policy_store import ActivePolicy, activate  # noqa: E402
from gtm.topology import GpuGroup, RegionSpec, Topology, ZoneSpec  # noqa: E402
from gtm.up.clients import ClientSampler, bundled_cities  # noqa: E402
from gtm.up.fleet import load_policies  # noqa: E402
from gtm.up.load import LoadConfig  # noqa: E402
from gtm.up.processes import free_port  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: gtm up prints this last once every region answers.
BANNER_END = "Ctrl-C stops everything."
#: Four GPUs per zone: two H100, one A100-80GB, one L40S (a mixed fleet, 8B only).
ZONE_GPUS = (("H100", 2), ("A100-80GB", 1), ("L40S", 1))
REGIONS = ("us-east", "eu-west")
TARGET = 0.10


def topology() -> Topology:
    rng = random.Random()
    block = f"127.{rng.randrange(100, 250)}.{rng.randrange(1, 250)}"
    regions = tuple(
        RegionSpec(
            id=region,
            address=f"{block}.{i}",
            zones=tuple(
                ZoneSpec(
                    id=f"{region}-{z}",
                    gpus=tuple(GpuGroup(type=t, models=(MODEL,), count=n) for t, n in ZONE_GPUS),
                )
                for z in ("a", "b")
            ),
        )
        for i, region in enumerate(REGIONS, start=1)
    )
    return Topology(regions=regions, models=(MODEL,), zone_port_base=rng.randrange(20_000, 30_000))


@dataclass(frozen=True, slots=True)
class Figures:
    ttft_p50: float
    ttft_p99: float
    e2e_p50: float
    e2e_p99: float
    success: float
    throughput: float


# ---------------------------------------------------------------------------- live


def live(
    topo: Topology, load: LoadConfig, speedup: float, processes: bool, workdir: Path
) -> dict[str, Any]:
    """``gtm up`` + ``gtm load --json``; the load's summary."""
    topo_path = workdir / "topology.yaml"
    topo_path.write_text(yaml.safe_dump(topo.model_dump(mode="json")), "utf-8")
    dns_port, http_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    command = [
        sys.executable, "-m", "gtm.cli", "up", "--topology", str(topo_path),
        "--dns-listen", f"127.0.0.1:{dns_port}", "--http-listen", f"127.0.0.1:{http_port}",
        "--run-dir", str(workdir / "run"), "--admin-dir", str(workdir / "admin"),
        "--speedup", f"{speedup:g}",
    ]  # fmt: skip
    if processes:
        command.append("--processes")
    stderr = (workdir / "up.stderr").open("wb")
    up = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    try:
        _wait_banner(up, workdir)
        out = workdir / "load.json"
        done = subprocess.run(
            [
                sys.executable, "-m", "gtm.cli", "load", "--trace", "mooncake",
                "--rate-scale", f"{load.rate_scale:g}", "--duration", f"{load.duration_s:g}",
                "--url", f"http://127.0.0.1:{http_port}", "--seed", str(load.seed),
                "--json", str(out),
            ],
            capture_output=True, text=True, timeout=load.duration_s * 4 + 120, check=False,
        )  # fmt: skip
        if not out.exists():
            raise SystemExit(f"gtm load failed ({done.returncode}):\n{done.stderr[-3000:]}")
        summary: dict[str, Any] = json.loads(out.read_text())
        return summary
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        stderr.close()


def _wait_banner(up: subprocess.Popen[bytes], workdir: Path) -> None:
    assert up.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = up.stdout.readline()
        if not line:
            errors = (workdir / "up.stderr").read_text()[-3000:]
            raise SystemExit(f"gtm up exited before it was ready:\n{errors}")
        if BANNER_END in line.decode(errors="replace"):
            return
    raise SystemExit("gtm up was not ready within 120 s")


def live_figures(summary: dict[str, Any], duration_s: float) -> Figures:
    return Figures(
        ttft_p50=summary["ttft_ms"]["p50"] / 1000.0,
        ttft_p99=summary["ttft_ms"]["p99"] / 1000.0,
        e2e_p50=summary["latency_ms"]["p50"] / 1000.0,
        e2e_p99=summary["latency_ms"]["p99"] / 1000.0,
        success=summary["success_ratio"] or 0.0,
        throughput=summary["succeeded"] / duration_s,
    )


# ---------------------------------------------------------------------------- simulated


def sim_requests(trace: Trace, load: LoadConfig, speedup: float) -> list[SimRequest]:
    """``gtm load``'s requests: same window, caps, cities (same seed), in sim time."""
    sampler = ClientSampler(bundled_cities(), random.Random(load.seed))
    places: dict[str, int] = {}
    out = []
    for k, r in enumerate(trace.window(load.duration_s, load.rate_scale)):
        city = sampler.sample().city
        pid = places.setdefault(f"{city.name}/{city.country}", len(places))
        out.append(
            SimRequest(
                at_s=r.at_s / load.rate_scale * speedup,
                input_tokens=min(r.input_tokens, load.max_input_tokens),
                output_tokens=max(1, min(r.output_tokens, load.max_output_tokens)),
                prefix_hashes=r.prefix_hashes,
                block_tokens=MOONCAKE_BLOCK_TOKENS,
                hash_key=hash(r.prefix_hashes[:1]) if r.prefix_hashes else k,
                tenant="load-test",
                country=city.country,
                point=city.location,
                place_id=pid,
            )
        )
    return out


def simulate(
    fleet: FleetSpec, active: ActivePolicy, requests: list[SimRequest], load: LoadConfig,
    speedup: float,
) -> Figures:  # fmt: skip
    window = load.duration_s * speedup
    result = Simulator(
        fleet, active, policy("gtm"), requests, model=MODEL, duration_s=window,
        drain_s=load.timeout_s * speedup, client_timeout_s=load.timeout_s * speedup,
        network=False,
    ).run()  # fmt: skip
    o = result.outcomes
    ok = o.status == Status.OK
    ttft, e2e = o.ttft_s[ok] / speedup, o.e2e_s[ok] / speedup

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q, method="inverted_cdf")) if len(a) else float("nan")

    return Figures(
        ttft_p50=pct(ttft, 50), ttft_p99=pct(ttft, 99), e2e_p50=pct(e2e, 50),
        e2e_p99=pct(e2e, 99), success=float(ok.mean()) if len(ok) else 0.0,
        throughput=float(ok.sum()) / load.duration_s,
    )  # fmt: skip


# ---------------------------------------------------------------------------- main


def compare(live_f: Figures, sim_f: Figures) -> list[str]:
    rows = ["| figure | live | simulated | sim ÷ live | within 10 % |", "|---|---:|---:|---:|---|"]
    for name in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "success", "throughput"):
        a, b = getattr(live_f, name), getattr(sim_f, name)
        ratio = b / a if a else float("nan")
        ok = abs(ratio - 1.0) <= TARGET
        rows.append(
            f"| {name} | {a:.3f} | {b:.3f} | {ratio:.2f} | {'met' if ok else '**MISSED**'} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--processes", action="store_true", help="live side: --processes")
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--load", type=float, default=0.5, help="offered load (of capacity)")
    parser.add_argument("--duration", type=float, default=60.0, help="wall s of trace")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    duration = 10.0 if args.smoke else args.duration
    trace = load_trace(TraceKind.MOONCAKE)
    topo = topology()
    active = activate(1, load_policies(()))
    fleet = fleet_from_topology(active, topo, MODEL)
    capacity = fleet_capacity_rps(fleet.gpu_types(), MODEL, trace)
    # Live GPUs are `speedup`× faster: the fleet serves speedup × capacity req/s of wall.
    native = trace.rate_per_s
    rate_scale = args.load * capacity * args.speedup / native
    load = LoadConfig(rate_scale=rate_scale, duration_s=duration, seed=0)
    requests = sim_requests(trace, load, args.speedup)
    print(
        f"{fleet.gpu_count} GPUs in {len(fleet.regions)} regions, speedup {args.speedup:g}, "
        f"capacity ≈ {capacity:.2f} req/s (real GPUs); load {args.load:.0%} → "
        f"{len(requests)} requests in {duration:g} s of wall (rate scale {rate_scale:.2f})",
        flush=True,
    )
    started = time.perf_counter()
    sim_f = simulate(fleet, active, requests, load, args.speedup)
    print(f"simulated in {time.perf_counter() - started:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="gtm-fidelity-") as tmp:
        summary = live(topo, load, args.speedup, args.processes, Path(tmp))
    live_f = live_figures(summary, duration)
    rows = compare(live_f, sim_f)
    print("\n".join(rows))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"live": _dict(live_f),
                        "simulated": _dict(sim_f), "requests": len(requests),
                        "speedup": args.speedup, "load": args.load,
                        "processes": args.processes, "duration_s": duration,
                        "live_summary": summary}, indent=2),
            encoding="utf-8",
        )  # fmt: skip


def _dict(f: Figures) -> dict[str, float]:
    return {name: getattr(f, name) for name in Figures.__slots__}


if __name__ == "__main__":
    main()

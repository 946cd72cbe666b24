"""Global tier: latency of one region decision over 50 regions (target p99 < 50 µs).

A realistic stream: the first 50 Azure regions at their real coordinates
(shared/data/latency), each with a published load summary; clients at the 5,000 most
populous cities (shared/data/geo), drawn by population; the three example tenants and
their residency rules; prompt sizes up to the Azure 2023 conversation trace's p99 (4k).
``GlobalRouter.decide`` runs the residency verdict and the routing profile (residency →
health → model filters, TTFT + load scorers, headroom-spread picker) on its fast path
(global_lb.pipeline: per-view arrays) behind its per-view decision cache.

Printed (µs): p50/p99 of ``decide`` on the stream while the view changes every
``--revision-every`` decisions (a summary was published: the cache starts empty; each
view also gets a fresh latency model, so client RTTs are recomputed — production keeps
one across views), the cache hit ratio; the same stream with the cache off (the fast
path decides every request); and the peers: the generic profile with and without the
cache (the path before the fast path). Each figure is wall-clock time, and thread CPU
time (``time.thread_time``: leaves out the time the scheduler gave to other jobs on a
shared machine, where a 4 ms time slice lands inside ~1 % of decisions).

    python bench/global_decision.py           # 200,000 decisions
    python bench/global_decision.py --smoke   # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import csv
import gc
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import yaml

from global_lb import profiles
from global_lb.geo import Location, LocationSource
from global_lb.health import HealthTable
from global_lb.keeper import build_view
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from global_lb.view import GlobalView
from gtm.models import ClientInfo, GeoPoint, ModelLoad, RegionSummary, RouteRequest
from gtm.policy_store import ActivePolicy, activate
from gtm.state.snapshot import FleetSnapshot
from policies import load_paths
from policies.loader import examples_path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TARGET_P99_S = 50e-6
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TENANTS = ("demo-global", "demo-eu", "acme-health")
REGIONS = 50


def policy_with_azure_regions(count: int) -> ActivePolicy:
    """The example policies with the first ``count`` Azure regions as the topology."""
    with (DATA / "latency" / "azure_regions.csv").open() as f:
        rows = list(csv.DictReader(f))[:count]
    regions = [
        {"id": r["region_id"], "name": r["region_name"], "country": r["country_iso"],
         "location": {"lat": float(r["lat"]), "lon": float(r["lon"])}}
        for r in rows
    ]  # fmt: skip
    document = {
        "apiVersion": "gtm.dev/v1",
        "kind": "Regions",
        "metadata": {"name": "azure"},
        "spec": {"regions": regions},
    }
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(examples_path() / "jurisdictions.yaml", Path(tmp) / "jurisdictions.yaml")
        tenants = yaml.safe_load((examples_path() / "tenants.yaml").read_text())
        for tenant in tenants["spec"]["tenants"]:  # shares name the example regions
            tenant.pop("regional_shares", None)
        (Path(tmp) / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        residency = yaml.safe_load((examples_path() / "residency.yaml").read_text())
        # The example's German-data rule needs a DE region; keep it only if there is one.
        if not any(r["country"] == "DE" for r in regions):
            residency["spec"]["rules"] = [
                r for r in residency["spec"]["rules"] if r["name"] != "de-only-data"
            ]
        (Path(tmp) / "residency.yaml").write_text(yaml.safe_dump(residency))
        (Path(tmp) / "regions.yaml").write_text(yaml.safe_dump(document))
        return activate(1, load_paths([tmp]))


def make_view(policy: ActivePolicy, revision: int, rng: random.Random) -> GlobalView:
    summaries = {
        rid: RegionSummary(
            region_id=rid,
            published_at=float(revision),
            models=(
                ModelLoad(
                    model=MODEL,
                    gpus=32,
                    healthy_gpus=32,
                    prefill_tokens_per_s=32 * 12_000.0,
                    queued_prefill_tokens=rng.randrange(0, 200_000),
                    running_requests=rng.randrange(0, 900),
                    max_running_requests=1024,
                ),
            ),
        )
        for rid in policy.policy_set.regions
    }
    snapshot = FleetSnapshot(revision=revision, region_summaries=MappingProxyType(summaries))
    return build_view(policy, snapshot, HealthTable(epoch=revision))


@dataclass(frozen=True, slots=True)
class Item:
    request: RouteRequest
    location: Location


def workload(n: int, rng: random.Random) -> list[Item]:
    with (DATA / "geo" / "cities_top5000.csv").open() as f:
        rows = list(csv.DictReader(f))
    weights = [int(r["population"]) for r in rows]
    picks = rng.choices(rows, weights=weights, k=n)
    import ipaddress

    network = ipaddress.ip_network("192.0.2.0/24")
    items = []
    for i, row in enumerate(picks):
        point = GeoPoint(lat=float(row["lat"]), lon=float(row["lon"]))
        country = row["country_iso"]
        request = RouteRequest(
            request_id=f"req-{i}",
            model=MODEL,
            input_tokens=rng.randrange(16, 4142),
            tenant=rng.choice(TENANTS),
            client=ClientInfo(country=country, location=point),
        )
        items.append(Item(request, Location(country, point, network, LocationSource.DATABASE)))
    return items


def run(
    router: GlobalRouter,
    policy: ActivePolicy,
    items: Sequence[Item],
    every: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[list[float], float]:
    rng = random.Random(7)
    timings: list[float] = []
    hits = 0
    view = make_view(policy, 1, rng)
    decide = router.decide
    for i, item in enumerate(items):
        if i and i % every == 0:
            view = make_view(policy, i, rng)
        start = clock()
        outcome = decide(item.request, view, item.location)
        timings.append(clock() - start)
        hits += outcome.cached
    return timings, hits / len(items)


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds (CI)")
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument(
        "--revision-every", type=int, default=10_000, help="decisions per view (a summary a second)"
    )
    args = parser.parse_args(argv)
    n = 20_000 if args.smoke else args.decisions
    policy = policy_with_azure_regions(REGIONS)
    items = workload(n, random.Random(1))
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    profile = profiles.build(global_registry(), spec, None)
    routers = {
        "fast path + cache": GlobalRouter(profile, spec),
        "fast path, no cache": GlobalRouter(profile, spec, cache_size=0),
        "profile + cache (peer)": GlobalRouter(profile, spec, fast_path=False),
        "profile, no cache (peer)": GlobalRouter(profile, spec, cache_size=0, fast_path=False),
    }
    gc.collect()
    gc.freeze()  # what a server does after start-up (gtm/routing/README.md)
    print(f"global decision over {len(policy.policy_set.regions)} regions, {n:,} decisions"
          f" (view changes every {args.revision_every:,}), µs")  # fmt: skip
    us = 1e6
    figures: dict[str, tuple[float, float]] = {}
    for label, router in routers.items():
        stream = items if "fast" in label else items[: min(len(items), 5_000)]
        wall, hit_ratio = run(router, policy, stream, args.revision_every)
        cpu, _ = run(router, policy, stream, args.revision_every, time.thread_time)
        p50, p99 = quantile(wall, 0.5) * us, quantile(wall, 0.99) * us
        c50, c99 = quantile(cpu, 0.5) * us, quantile(cpu, 0.99) * us
        figures[label] = (p99, c99)
        print(f"  {label:<25} wall p50 {p50:6.1f} p99 {p99:7.1f} | cpu p50 {c50:6.1f}"
              f" p99 {c99:6.1f} | hit ratio {hit_ratio:.3f}")  # fmt: skip
    p99, c99 = figures["fast path + cache"]
    peer99 = figures["profile + cache (peer)"][1]
    print(f"fast path + cache vs profile + cache (cpu p99): {peer99 / c99:.1f}x faster")
    for what, value in (("wall", p99), ("cpu", c99)):
        verdict = "met" if value < TARGET_P99_S * us else "MISSED"
        print(f"target: p99 < {TARGET_P99_S * us:.0f} µs ({what}): {value:.1f} µs, {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

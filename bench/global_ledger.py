"""Global tier: what the in-flight ledger costs the front door per request.

The stream of bench/global_decision.py (50 Azure regions with load summaries, clients at
the 5,000 most populous cities, the example tenants, prompts up to 4k tokens), at
10,000 requests a second with a new summary every second (``--revision-every``). Per
request the front door takes the ledger's overlay of the view, decides
(``GlobalRouter.decide``: residency, cache, fast path) and charges the chosen region —
global_lb/api.py's path. An overlay is rebuilt when some region's charges not yet
in it reach ``resolution_ms`` of queueing, and every rebuild starts the decision cache
afresh, so the figure depends on the resolution.

Printed per setting (µs, thread CPU time, so other jobs on the shared machine count
less): p50 / p99 per request, overlays built, the decision cache's hit ratio, and the
ratio to the same stream without the ledger (``off``) measured in the same run.

    python bench/global_ledger.py           # 100,000 requests per setting
    python bench/global_ledger.py --smoke   # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from array import array
from collections.abc import Sequence
from pathlib import Path

# Run as a script, sys.path starts at bench/, not at the repository root: add the root so
# the stream is imported as bench/global_decision.py's own.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.global_decision import (
    MODEL,
    REGIONS,
    Item,
    make_view,
    policy_with_azure_regions,
    workload,
)
from global_lb import profiles
from global_lb.inflight import InflightLedger, LedgerSettings
from global_lb.plugins import global_registry
from global_lb.router import GlobalRouter
from global_lb.view import LatencyModel
from gtm.policy_store import ActivePolicy
from gtm.serve import settle_collector
from gtm.stats import percentile

#: Requests per second the stream stands for (the ledger's clock).
RATE = 10_000.0
SETTINGS = {
    "off": LedgerSettings(enabled=False),
    "every charge (0 ms)": LedgerSettings(resolution_ms=0.0),
    "2 ms": LedgerSettings(resolution_ms=2.0),
    "10 ms": LedgerSettings(resolution_ms=10.0),
    "default": LedgerSettings(),
    "100 ms": LedgerSettings(resolution_ms=100.0),
}


def run(
    policy: ActivePolicy, items: Sequence[Item], every: int, settings: LedgerSettings
) -> tuple[array[float], int, float]:
    """Per-request CPU seconds, overlays built, cache hit ratio."""
    spec = profiles.profile_spec(None, "global-default", profiles.DEFAULT_REQUEST_PROFILE)
    router = GlobalRouter(profiles.build(global_registry(), spec, None), spec)
    ledger = InflightLedger(settings)
    rng = random.Random(7)
    latency = LatencyModel()
    base = make_view(policy, 1, rng, latency)
    seconds = array("d")
    hits = overlays = 0
    last = None
    clock = time.thread_time
    for i, item in enumerate(items):
        now = i / RATE
        if i and i % every == 0:
            # make_view stamps summaries with its revision; seconds of the stream here.
            base = make_view(policy, i, rng, latency)
        start = clock()
        view = ledger.view(base, now)
        outcome = router.decide(item.request, view, item.location)
        if outcome.region is not None:
            ledger.charge(outcome.region, MODEL, item.request.input_tokens, now)
        seconds.append(clock() - start)
        hits += outcome.cached
        if view is not last:
            overlays += 1
            last = view
    return seconds, overlays, hits / max(1, len(items))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds (CI)")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--revision-every", type=int, default=10_000)
    args = parser.parse_args(argv)
    n = 5_000 if args.smoke else args.requests
    policy = policy_with_azure_regions(REGIONS)
    items = workload(n, random.Random(1))
    gc.collect()
    settle_collector()  # what `gtm global` does after start-up (gc.freeze, gen-0 threshold)
    default_ms = LedgerSettings().resolution_ms
    print(
        f"front door per request with the in-flight ledger: {len(policy.policy_set.regions)} "
        f"regions, {n:,} requests at {RATE:,.0f}/s, a summary every {args.revision_every:,} "
        f"(default resolution {default_ms:g} ms), µs of thread CPU time"
    )
    base_p50 = base_p99 = 0.0
    for label, settings in SETTINGS.items():
        seconds, overlays, hit = run(policy, items, args.revision_every, settings)
        p50, p99 = percentile(seconds, 0.5) * 1e6, percentile(seconds, 0.99) * 1e6
        if label == "off":
            base_p50, base_p99 = p50, p99
        print(
            f"  {label:<20} p50 {p50:7.1f}  p99 {p99:7.1f}  ({p50 / base_p50:4.1f}× / "
            f"{p99 / base_p99:4.1f}× off)  overlays {overlays:,}  cache hits {hit:.0%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

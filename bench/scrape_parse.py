"""Scrape parsing: one worker's ``/metrics`` read into ``GpuMetrics``, per engine flavour.

The zone agent parses every worker's exposition each scrape interval, so this cost times
the workers over the interval is the CPU its scraping takes. Each flavour's text is what
``gtm gpu-sim --metrics-flavor F`` serves for a busy worker (histograms filled by real
passes), parsed by ``zone_agent.scrape.parse_metrics`` — the line filter, then
prometheus_client's parser on the lines kept. Peer: prometheus_client's parser on the
whole text, what reading without the filter would cost.

    python bench/scrape_parse.py            # 2,000 parses per flavour
    python bench/scrape_parse.py --smoke    # 100 per flavour (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpusim.engine import Engine, EngineConfig, EngineRequest
from gpusim.metrics import EngineMetrics, MetricsFlavor, ModelSnapshot
from gpusim.perfmodel import Degradation
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.metrics import new_registry
from zone_agent.scrape import Flavor, _relevant, parse_metrics

#: How often the zone agent scrapes (zone_agent.config's default) and a large zone.
SCRAPE_INTERVAL_S = 0.25
WORKERS = 1_000


def exposition(flavor: MetricsFlavor) -> str:
    """A busy emulated worker's /metrics: 64 requests run through, 16 still in flight."""
    profile = dataclasses.replace(get_profile("H100", LLAMA_8B), max_num_seqs=16)
    engine = Engine(profile, EngineConfig(degradation=Degradation(warmup_passes=0)))
    registry = new_registry()
    metrics = EngineMetrics(
        registry,
        flavor,
        lambda: [ModelSnapshot(LLAMA_8B, profile, engine.stats(), 100.0)],
    )
    for index in range(64):
        engine.add(EngineRequest(f"r{index}", 200 + 37 * index, 20 + index % 50), 0.0)
    now = 0.0
    while engine.stats().requests_finished_total < 48:
        result = engine.step(now)
        assert result is not None
        metrics.observe_step(LLAMA_8B, result)
        for finished in result.finished:
            metrics.observe_finished(LLAMA_8B, finished, "length")
        now += result.duration
    return generate_latest(registry).decode()


def per_call_us(call: Callable[[str], object], text: str, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        call(text)
    return (time.perf_counter() - start) / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="100 parses per flavour (CI)")
    args = parser.parse_args()
    count = 100 if args.smoke else 2_000
    ok = True
    print(f"{'flavour':9} {'bytes':>7} {'lines':>6} {'kept':>5} {'parse µs':>9} {'peer µs':>8}")
    for flavor in MetricsFlavor:
        text = exposition(flavor)
        parsed = parse_metrics(text, scraped_at=0.0, default_model=LLAMA_8B)
        ok &= parsed.flavor is Flavor(flavor.value) and LLAMA_8B in parsed.models
        ours = per_call_us(
            lambda t: parse_metrics(t, scraped_at=0.0, default_model=LLAMA_8B), text, count
        )
        peer = per_call_us(lambda t: list(text_string_to_metric_families(t)), text, count)
        kept = _relevant(text).count("\n")
        print(
            f"{flavor.value:9} {len(text):>7,} {text.count(chr(10)):>6} {kept:>5} "
            f"{ours:>9,.0f} {peer:>8,.0f}   "
            f"({WORKERS:,} workers every {SCRAPE_INTERVAL_S:g} s: "
            f"{ours * WORKERS / SCRAPE_INTERVAL_S / 1e6:.2f} CPU)"
        )
    if not ok:
        print("  a flavour was not read back as itself")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

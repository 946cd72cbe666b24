"""Scrape parsing: one worker's ``/metrics`` read into ``GpuMetrics``, per engine flavour.

The zone agent parses every worker's exposition each scrape interval, so this cost times
the workers over the interval is the CPU its scraping takes. Each flavour's text is what
``gtm gpu-sim --metrics-flavor F`` serves for a busy worker (histograms filled by real
passes), parsed by ``zone_agent.scrape.parse_metrics`` two ways, side by side:

* ``reader``: the path the agent takes — ``zone_agent.exposition.SampleReader``, its
  line loop compiled (``zone_agent/_exposition.c``; its Python form beside it, in the
  "reader's loop" columns: ``SampleReader.read`` alone, each way);
* ``reference``: the line filter, then prometheus_client's parser on the lines kept
  (what the agent did before the reader, and still does where the reader steps aside).

Columns: the whole parse by each and their ratio; the kept lines alone (the filter's
output) by each and their ratio; the CPUs a zone of ``WORKERS`` workers scraped every
``SCRAPE_INTERVAL_S`` needs for parsing, by each. Times are process CPU time (the best
of five runs), so other processes' load moves them less than wall time would.

    python bench/scrape_parse.py            # 5 × 400 parses per flavour by the reader
    python bench/scrape_parse.py --smoke    # 5 × 20 (CI)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from gpusim.metrics import MetricsFlavor
from gpusim.samples import busy_exposition
from gtm.gpu_profiles import LLAMA_8B
from zone_agent import exposition as reader_module
from zone_agent.exposition import SampleReader
from zone_agent.scrape import _READER, Flavor, GpuMetrics, Parser, _relevant, parse_metrics

#: How often the zone agent scrapes (zone_agent.config's default) and a large zone.
SCRAPE_INTERVAL_S = 0.25
WORKERS = 1_000


def exposition(flavor: MetricsFlavor) -> str:
    """A busy emulated worker's /metrics: 64 requests run through, 16 still in flight."""
    return busy_exposition(flavor, requests=64, finished=48, max_num_seqs=16)


def per_call_us(call: Callable[[str], object], text: str, count: int) -> float:
    """Process CPU µs per call, the best of five runs of ``count`` calls."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(count):
            call(text)
        best = min(best, (time.process_time() - start) / count * 1e6)
    return best


def _parse(parser: Parser) -> Callable[[str], GpuMetrics]:
    return lambda text: parse_metrics(text, scraped_at=0.0, default_model=LLAMA_8B, parser=parser)


def _cpus(us: float) -> float:
    return us * WORKERS / SCRAPE_INTERVAL_S / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="5 × 20 parses per flavour (CI)")
    args = parser.parse_args()
    count = 20 if args.smoke else 400
    ok = True
    print(
        f"{'flavour':9} {'bytes':>7} {'lines':>6} {'kept':>5} | whole µs: {'reader':>7} "
        f"{'reference':>9} {'ratio':>5} | kept lines µs: {'reader':>7} {'reference':>9} "
        f"{'ratio':>5} | reader's loop µs: {'C':>5} {'Python':>6} {'ratio':>5} "
        f"| CPUs, {WORKERS:,} workers every {SCRAPE_INTERVAL_S:g} s: reader, reference"
    )
    python_loop = SampleReader(_READER.prefixes, _READER.wanted, compiled=False)
    if not reader_module.COMPILED:
        print("  the reader's loop is not compiled here (no C compiler?): both columns are Python")
    for flavor in MetricsFlavor:
        text = exposition(flavor)
        kept = _relevant(text)
        fast, slow = _parse(Parser.READER), _parse(Parser.REFERENCE)
        parsed = fast(text)
        same = parsed.models == _parse(Parser.REFERENCE)(text).models
        ok &= same and parsed.parsed_by is Parser.READER
        ok &= parsed.flavor is Flavor(flavor.value) and LLAMA_8B in parsed.models
        whole = per_call_us(fast, text, count), per_call_us(slow, text, count // 4 or 1)
        lines = per_call_us(fast, kept, count), per_call_us(slow, kept, count // 4 or 1)
        ok &= _READER.read(text) == python_loop.read(text)
        loop = per_call_us(_READER.read, text, count), per_call_us(python_loop.read, text, count)
        print(
            f"{flavor.value:9} {len(text):>7,} {text.count(chr(10)):>6} {kept.count(chr(10)):>5} "
            f"| {'':10}{whole[0]:>7,.0f} {whole[1]:>9,.0f} {whole[1] / whole[0]:>5.1f} "
            f"| {'':14}{lines[0]:>7,.0f} {lines[1]:>9,.0f} {lines[1] / lines[0]:>5.1f} "
            f"| {'':17}{loop[0]:>5,.0f} {loop[1]:>6,.0f} {loop[1] / loop[0]:>5.1f} "
            f"| {_cpus(whole[0]):.2f}, {_cpus(whole[1]):.2f}"
        )
    if not ok:
        print("  a flavour was not read back as itself, or the parsers (or loops) disagree")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost of one routing decision: the core runner over 10 … 10,000 candidates.

The profile is a realistic zone-agent shape: 3 filters (allow-list from the snapshot,
health, model served), 3 scorers (queue, KV-cache headroom, predicted TTFT — which is also
the cost model), and the max-score picker, all columnar (candidates are positions, the
snapshot's columns are numpy arrays; health and model masks are the plugins' per-view
``prepare`` work). About 10 % of candidates are filtered out.

Printed per size (latencies in µs):

* ``p50`` / ``p99`` — ``Runner.decide`` and the full trace (``Outcome.to_decision()``),
  no metrics, as a caller that logs every decision pays;
* ``p50 lazy`` — ``Runner.decide`` alone: the trace is built only when asked for;
* ``+metrics`` — with Prometheus metrics (decision duration every time, plugin durations
  on one decision in 256, the default ``plugin_timing_every``); ``all timed`` times every
  plugin on every decision (``plugin_timing_every=1``);
* ``p99 frozen`` — after ``gc.freeze()``, which a server calls once after start-up;
* ``top-16`` — the trace keeps only the 16 best candidates' scores (``trace_scores``);
* ``plugins`` — the plugin calls alone (the same objects, called in sequence with no
  framework and no trace), and ``framework`` = lazy p50 − that: what the runner costs;
* ``× hand`` — lazy p50 over a hand-written numpy function that computes the same choice
  (the floor any framework pays on top of).

Targets (issue 7, checked at the end): 50 candidates p99 < 50 µs; 1,000 candidates
p50 < 1 ms (both full trace, no metrics).

    python bench/routing_framework.py           # full run (~1 min)
    python bench/routing_framework.py --smoke   # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gtm.metrics import new_registry
from gtm.models import RouteRequest, Tier
from gtm.routing import Batch, Capability, Plugin, Removal, RoutingMetrics, Runner, Weighted
from gtm.routing.filters.allow_list import AllowListFilter
from gtm.routing.filters.allow_list import Params as AllowParams
from gtm.routing.framework import Bools, Floats
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.routing.runner import DEFAULT_PLUGIN_TIMING_EVERY
from gtm.stats import percentile

SIZES = (10, 50, 100, 1_000, 10_000)
#: (candidates, quantile, bound in seconds): the targets of issue 7.
TARGETS = ((50, 0.99, 50e-6), (1_000, 0.5, 1e-3))
MODEL = "llama-3.1-8b"
SCALE_MS = 500.0


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The view: one column per GPU attribute, by position (ids sorted)."""

    ids: tuple[str, ...]
    healthy: Bools
    serves: Bools  # serves MODEL
    queued: Floats
    rate: Floats
    kv_free: Floats
    allowed: frozenset[str]


class GpuBatch(Batch):
    __slots__ = ("snap",)
    ids_ascending = True
    request: RouteRequest

    def __init__(self, request: RouteRequest, snap: Snapshot) -> None:
        super().__init__(snap.ids, request, snap)
        self.snap = snap

    def allowed_ids(self) -> Set[str] | None:
        return self.snap.allowed


def _unhealthy(position: int) -> str:
    return "unhealthy"


def _not_loaded(position: int) -> str:
    return "model not loaded"


class HealthFilter(Plugin):
    capabilities: ClassVar[frozenset[Any]] = frozenset({Capability.PREPARE})

    def prepare(self, view: Snapshot, /) -> Removal | None:
        mask = ~view.healthy
        return Removal(mask, _unhealthy) if mask.any() else None

    def removes(self, batch: GpuBatch, /) -> Removal | None:
        removal: Removal | None = batch.prepared[self]
        return removal


class ModelFilter(Plugin):
    capabilities: ClassVar[frozenset[Any]] = frozenset({Capability.PREPARE})

    def prepare(self, view: Snapshot, /) -> Removal | None:
        mask = ~view.serves
        return Removal(mask, _not_loaded) if mask.any() else None

    def removes(self, batch: GpuBatch, /) -> Removal | None:
        if batch.request.model != MODEL:
            return Removal(np.ones(len(batch), dtype=np.bool_), _not_loaded)
        removal: Removal | None = batch.prepared[self]
        return removal


class QueueScorer(Plugin):
    """Min-max over queued tokens among the survivors (llm-d queue-scorer style)."""

    def scores(self, batch: GpuBatch, /) -> Floats:
        queued = batch.snap.queued
        live = queued[batch.survivors]
        low, high = float(live.min()), float(live.max())
        span = (high - low) or 1.0
        scores: Floats = (high - queued) / span
        return scores


class KvScorer(Plugin):
    def scores(self, batch: GpuBatch, /) -> Floats:
        return batch.snap.kv_free


def ttft_costs(snap: Snapshot, own: float) -> Floats:
    """Predicted TTFT (gtm.routing.cost.predicted_ttft_ms with no RTT), per GPU."""
    costs: Floats = 1000.0 * (snap.queued + own) / snap.rate
    return costs


def ttft_scores(costs: Floats, survivors: Any) -> Floats:
    best = float(costs[survivors].min())
    scores: Floats = np.exp(-(costs - best) / SCALE_MS)
    return scores


class TtftScorer(Plugin):
    """Scores by predicted TTFT and is the profile's cost model too."""

    def costs_ms(self, batch: GpuBatch, /) -> Floats:
        return ttft_costs(batch.snap, float(batch.request.input_tokens))

    def scores(self, batch: GpuBatch, /) -> Floats:
        return ttft_scores(self.costs_ms(batch), batch.survivors)


Decide = Callable[[RouteRequest, Snapshot], object]


def fleet(n: int, rng: random.Random) -> Snapshot:
    ids = tuple(f"gpu-{i:05d}" for i in range(n))
    healthy = np.array([rng.random() > 0.03 for _ in ids])
    serves = np.array([rng.random() > 0.03 for _ in ids])
    queued = np.array([float(rng.randrange(0, 50_000)) for _ in ids])
    rate = np.array([rng.choice((6_000.0, 12_000.0, 20_000.0)) for _ in ids])
    kv_free = np.array([rng.random() for _ in ids])
    allowed = {i for i in ids if rng.random() > 0.03}
    if not any(healthy[k] and serves[k] and ids[k] in allowed for k in range(n)):
        # Keep at least one eligible GPU so small fleets never refuse.
        healthy[0], serves[0], queued[0], rate[0], kv_free[0] = True, True, 0.0, 12_000.0, 0.5
        allowed.add(ids[0])
    return Snapshot(ids, healthy, serves, queued, rate, kv_free, frozenset(allowed))


def build_profile(
    metrics: RoutingMetrics | None = None,
    trace_scores: int | None = None,
    plugin_timing_every: int = DEFAULT_PLUGIN_TIMING_EVERY,
) -> Runner[GpuBatch]:
    ttft = TtftScorer("ttft")
    return Runner(
        "bench",
        Tier.ZONE,
        [
            AllowListFilter("allowed", AllowParams(from_context=True)),
            HealthFilter("health"),
            ModelFilter("model"),
        ],
        [
            Weighted(QueueScorer("queue"), 1.0),
            Weighted(KvScorer("kv"), 1.0),
            Weighted(ttft, 2.0),
        ],
        MaxScorePicker(),
        cost_model=ttft,
        metrics=metrics,
        trace_scores=trace_scores,
        plugin_timing_every=plugin_timing_every,
    )


def traced(profile: Runner[GpuBatch]) -> Decide:
    def decide(request: RouteRequest, snap: Snapshot) -> object:
        return profile.decide(GpuBatch(request, snap)).to_decision()

    return decide


def lazy(profile: Runner[GpuBatch]) -> Decide:
    def decide(request: RouteRequest, snap: Snapshot) -> object:
        return profile.decide(GpuBatch(request, snap))

    return decide


def plugins_only(snap: Snapshot) -> Decide:
    """The plugin calls of one decision, in sequence, without the framework."""
    profile = build_profile()
    filters = profile.filters
    scorers = [w.scorer for w in profile.scorers]
    picker, ttft = profile.picker, TtftScorer("ttft")
    prepared: dict[object, Any] = {f: f.prepare(snap) for f in filters[1:]}  # type: ignore[attr-defined]

    def decide(request: RouteRequest, snap: Snapshot) -> object:
        batch = GpuBatch(request, snap)
        batch.prepared = prepared
        for f in filters:
            removal = f.removes(batch)
            if removal is not None:
                np.greater(batch.alive, removal.mask, out=batch.alive)
                batch.all_alive = False
        batch.seal()
        queue, kv, ttft_column = (np.asarray(s.scores(batch)) for s in scorers)
        totals = (queue + kv + ttft_column * 2.0) / 4.0
        return ttft.costs_ms(batch)[picker.pick(batch, totals)]

    return decide


def hand_rolled(request: RouteRequest, snap: Snapshot) -> str:
    """The same choice, written as one numpy function with no framework and no trace."""
    allowed = np.fromiter((i in snap.allowed for i in snap.ids), np.bool_, len(snap.ids))
    alive = allowed & snap.healthy & snap.serves
    survivors = alive.nonzero()[0]
    live = snap.queued[survivors]
    low, high = float(live.min()), float(live.max())
    queue = (high - snap.queued) / ((high - low) or 1.0)
    ttft = ttft_scores(ttft_costs(snap, float(request.input_tokens)), survivors)
    totals = (queue + snap.kv_free + ttft * 2.0) / 4.0
    return snap.ids[int(survivors[totals[survivors].argmax()])]


def measure(decide: Decide, snap: Snapshot, budget_s: float, min_runs: int) -> list[float]:
    """Per-decision seconds, each request with its own id, for at least ``budget_s``."""
    requests = [
        RouteRequest(request_id=f"r{i}", model=MODEL, input_tokens=2_000, tenant="t")
        for i in range(64)
    ]
    samples: list[float] = []
    gc.collect()  # every configuration starts from the same heap
    clock = time.perf_counter
    deadline = clock() + budget_s
    i = 0
    while i < min_runs or clock() < deadline:
        request = requests[i % len(requests)]
        start = clock()
        decide(request, snap)
        samples.append(clock() - start)
        i += 1
    return samples


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


@dataclass(frozen=True, slots=True)
class Row:
    """One size's figures (seconds)."""

    n: int
    base: list[float]
    lazy: list[float]
    metered: list[float]
    all_timed: list[float]
    frozen: list[float]
    top16: list[float]
    plugins: list[float]
    floor: list[float]

    def cells(self) -> tuple[str, ...]:
        p50 = percentile(self.lazy, 0.5)
        plugins = percentile(self.plugins, 0.5)
        return (
            f"{self.n:,}",
            f"{1 / statistics.fmean(self.base):,.0f}",
            us(percentile(self.base, 0.5)),
            us(percentile(self.base, 0.99)),
            us(p50),
            us(percentile(self.metered, 0.5)),
            us(percentile(self.metered, 0.99)),
            us(percentile(self.all_timed, 0.5)),
            us(percentile(self.frozen, 0.99)),
            us(percentile(self.top16, 0.5)),
            us(plugins),
            us(p50 - plugins),
            f"{p50 / percentile(self.floor, 0.5):.2f}",
        )


HEADER = (
    "candidates",
    "decisions/s",
    "p50",
    "p99",
    "p50 lazy",
    "p50 +metrics",
    "p99 +metrics",
    "p50 all timed",
    "p99 frozen",
    "p50 top-16",
    "p50 plugins",
    "framework",
    "× hand",
)


def run_size(n: int, rng: random.Random, budget: float) -> Row:
    snap = fleet(n, rng)
    plain = build_profile()
    metered = build_profile(metrics=RoutingMetrics(new_registry()))
    req = RouteRequest(request_id="check", model=MODEL, input_tokens=2_000, tenant="t")
    if plain.decide(GpuBatch(req, snap)).choice_id != hand_rolled(req, snap):
        raise SystemExit(f"{n} candidates: the profile and the hand-written floor disagree")
    min_runs = 20 if n >= 10_000 else 100
    half = (budget / 2, min_runs // 2)
    base = measure(traced(plain), snap, budget, min_runs)
    no_trace = measure(lazy(plain), snap, *half)
    with_metrics = measure(traced(metered), snap, *half)
    timed_profile = build_profile(metrics=RoutingMetrics(new_registry()), plugin_timing_every=1)
    all_timed = measure(traced(timed_profile), snap, *half)
    top16 = measure(traced(build_profile(trace_scores=16)), snap, *half)
    plugins = measure(plugins_only(snap), snap, *half)
    floor = measure(hand_rolled, snap, *half)
    gc.freeze()
    frozen = measure(traced(plain), snap, *half)
    gc.unfreeze()
    return Row(n, base, no_trace, with_metrics, all_timed, frozen, top16, plugins, floor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run for CI")
    args = parser.parse_args()
    budget = 0.25 if args.smoke else 3.0
    rng = random.Random(20_260_101)
    print(
        "Runner.decide: 3 filters, 3 scorers, max-score picker, latencies in µs "
        f"({'smoke' if args.smoke else 'full'})"
    )
    widths = [max(len(h), 8) for h in HEADER]
    print(" ".join(h.rjust(w) for h, w in zip(HEADER, widths, strict=True)))
    rows = {}
    for n in SIZES:
        row = run_size(n, rng, budget)
        rows[n] = row
        print(" ".join(c.rjust(w) for c, w in zip(row.cells(), widths, strict=True)), flush=True)
    for n, q, bound in TARGETS:
        got = percentile(rows[n].base, q)
        verdict = "met" if got < bound else "MISSED"
        print(f"target: {n:,} candidates p{q * 100:.0f} < {us(bound)} µs: {us(got)} µs, {verdict}")


if __name__ == "__main__":
    main()

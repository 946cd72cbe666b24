"""Cost of one routing decision: Profile.run over 10 … 10,000 candidates.

The profile is a realistic zone-agent shape: 3 filters (allow-list from the snapshot,
health, model served), 3 scorers (queue, KV-cache headroom, predicted TTFT — which is also
the cost model), and the max-score picker. About 10 % of candidates are filtered out.

Printed per size (latencies in µs):

* ``p50`` / ``p99`` — Profile.run with the full trace, no metrics;
* ``+metrics`` — with Prometheus metrics (decision duration every time, plugin durations
  on one decision in 16, the default ``plugin_timing_every``); ``all timed`` times every
  plugin on every decision (``plugin_timing_every=1``);
* ``p99 frozen`` — after ``gc.freeze()``, which a server calls once after start-up to take
  its long-lived objects out of the garbage collector's walks (the p99 over many
  candidates is mostly those walks);
* ``top-16`` — the trace keeps only the 16 best candidates' scores (``trace_scores``);
* ``plugins`` — the plugin calls alone (the same filter, scorer, picker and cost-model
  objects, called in sequence with no framework and no trace), and ``framework`` = p50 −
  that: what the runner itself costs;
* ``× hand`` — p50 over a hand-written function that computes the same choice with no
  framework and no trace (the floor any framework pays on top of).

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
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from gtm.metrics import new_registry
from gtm.models import RouteRequest, Tier
from gtm.routing import FilterResult, Profile, RoutingMetrics, Scored, WeightedScorer
from gtm.routing.cost import predicted_ttft_ms, scores_from_costs
from gtm.routing.filters.allow_list import AllowListFilter
from gtm.routing.filters.allow_list import Params as AllowParams
from gtm.routing.pickers.max_score import MaxScorePicker
from gtm.stats import percentile

SIZES = (10, 50, 100, 1_000, 10_000)
#: (candidates, quantile, bound in seconds): the targets of issue 7.
TARGETS = ((50, 0.99, 50e-6), (1_000, 0.5, 1e-3))
MODEL = "llama-3.1-8b"
SCALE_MS = 500.0


@dataclass(frozen=True, slots=True)
class Gpu:
    id: str
    healthy: bool
    models: frozenset[str]
    queued_tokens: int
    prefill_tokens_per_s: float
    kv_free: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    allowed: frozenset[str]

    def allowed_ids(self, request: RouteRequest, /) -> Set[str] | None:
        return self.allowed


class HealthFilter:
    name = "health"

    def filter(
        self, request: RouteRequest, candidates: Sequence[Gpu], ctx: Snapshot, /
    ) -> FilterResult[Gpu]:
        kept = [c for c in candidates if c.healthy]
        if len(kept) == len(candidates):
            return FilterResult(tuple(candidates))
        removed = [(c.id, "unhealthy") for c in candidates if not c.healthy]
        return FilterResult(tuple(kept), tuple(removed))


class ModelFilter:
    name = "model"

    def filter(
        self, request: RouteRequest, candidates: Sequence[Gpu], ctx: Snapshot, /
    ) -> FilterResult[Gpu]:
        model = request.model
        kept = [c for c in candidates if model in c.models]
        if len(kept) == len(candidates):
            return FilterResult(tuple(candidates))
        removed = [(c.id, "model not loaded") for c in candidates if model not in c.models]
        return FilterResult(tuple(kept), tuple(removed))


class QueueScorer:
    """Min-max over queued tokens (llm-d queue-scorer style)."""

    name = "queue"

    def score(
        self, request: RouteRequest, candidates: Sequence[Gpu], ctx: Snapshot, /
    ) -> Mapping[str, float]:
        queued = [c.queued_tokens for c in candidates]
        low, high = min(queued), max(queued)
        span = (high - low) or 1
        return {c.id: (high - c.queued_tokens) / span for c in candidates}


class KvScorer:
    name = "kv"

    def score(
        self, request: RouteRequest, candidates: Sequence[Gpu], ctx: Snapshot, /
    ) -> Mapping[str, float]:
        return {c.id: c.kv_free for c in candidates}


class TtftScorer:
    """Scores by predicted TTFT and is the profile's cost model too."""

    name = "ttft"

    def cost_ms(self, request: RouteRequest, candidate: Gpu, ctx: Snapshot, /) -> float:
        return predicted_ttft_ms(
            0.0, candidate.queued_tokens, request.input_tokens, candidate.prefill_tokens_per_s
        )

    def score(
        self, request: RouteRequest, candidates: Sequence[Gpu], ctx: Snapshot, /
    ) -> Mapping[str, float]:
        own = request.input_tokens
        costs = {
            c.id: predicted_ttft_ms(0.0, c.queued_tokens, own, c.prefill_tokens_per_s)
            for c in candidates
        }
        return scores_from_costs(costs, SCALE_MS)


Decide = Callable[[RouteRequest, Sequence[Gpu], Snapshot], object]


def fleet(n: int, rng: random.Random) -> tuple[list[Gpu], Snapshot]:
    gpus = [
        Gpu(
            id=f"gpu-{i:05d}",
            healthy=rng.random() > 0.03,
            models=frozenset({MODEL} if rng.random() > 0.03 else {"other"}),
            queued_tokens=rng.randrange(0, 50_000),
            prefill_tokens_per_s=rng.choice((6_000.0, 12_000.0, 20_000.0)),
            kv_free=rng.random(),
        )
        for i in range(n)
    ]
    allowed = frozenset(g.id for g in gpus if rng.random() > 0.03)
    if not allowed or not any(g.healthy and MODEL in g.models and g.id in allowed for g in gpus):
        # Keep at least one eligible GPU so small fleets never refuse.
        gpus[0] = Gpu(gpus[0].id, True, frozenset({MODEL}), 0, 12_000.0, 0.5)
        allowed = allowed | {gpus[0].id}
    return gpus, Snapshot(allowed)


def build_profile(
    metrics: RoutingMetrics | None = None,
    trace_scores: int | None = None,
    plugin_timing_every: int | None = None,
) -> Profile[Gpu, Snapshot]:
    ttft = TtftScorer()
    # Only passed when set, so this file also measures the framework as it was before
    # plugin_timing_every existed (for before/after figures on one machine).
    timing = {} if plugin_timing_every is None else {"plugin_timing_every": plugin_timing_every}
    return Profile(
        "bench",
        Tier.ZONE,
        [AllowListFilter("allowed", AllowParams(from_context=True)), HealthFilter(), ModelFilter()],
        [
            WeightedScorer(QueueScorer(), 1.0),
            WeightedScorer(KvScorer(), 1.0),
            WeightedScorer(ttft, 2.0),
        ],
        MaxScorePicker(),
        cost_model=ttft,
        metrics=metrics,
        trace_scores=trace_scores,
        **timing,  # type: ignore[arg-type]
    )


def plugins_only(gpus: Sequence[Gpu], snap: Snapshot) -> Decide:
    """The plugin calls of one decision, in sequence, without the framework.

    The picker's input does not depend on the request id, so it is built once here; what
    is timed is exactly the work the plugins do.
    """
    ttft = TtftScorer()
    filters = (
        AllowListFilter[Gpu]("allowed", AllowParams(from_context=True)),
        HealthFilter(),
        ModelFilter(),
    )
    scorers = (QueueScorer(), KvScorer(), ttft)
    picker: MaxScorePicker[Gpu] = MaxScorePicker()
    probe = RouteRequest(request_id="probe", model=MODEL, input_tokens=2_000, tenant="t")
    live: Sequence[Gpu] = gpus
    for f in filters:
        live = f.filter(probe, live, snap).kept
    columns = [s.score(probe, live, snap) for s in scorers]
    scored = [
        Scored(g, (columns[0][g.id] + columns[1][g.id] + 2 * columns[2][g.id]) / 4) for g in live
    ]

    def decide(request: RouteRequest, gpus: Sequence[Gpu], snap: Snapshot) -> object:
        current: Sequence[Gpu] = gpus
        for f in filters:
            current = f.filter(request, current, snap).kept
        for s in scorers:
            s.score(request, current, snap)
        return ttft.cost_ms(request, picker.pick(request, scored), snap)

    return decide


def hand_rolled(request: RouteRequest, gpus: Sequence[Gpu], snap: Snapshot) -> str:
    """The same choice, written as one function with no framework and no trace."""
    live = [g for g in gpus if g.id in snap.allowed and g.healthy and request.model in g.models]
    queue = QueueScorer().score(request, live, snap)
    ttft = TtftScorer().score(request, live, snap)
    totals = {g.id: (queue[g.id] + g.kv_free + 2 * ttft[g.id]) / 4 for g in live}
    top = max(totals.values())
    return min(cid for cid, total in totals.items() if total == top)


def measure(
    decide: Decide, gpus: Sequence[Gpu], snap: Snapshot, budget_s: float, min_runs: int
) -> list[float]:
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
        decide(request, gpus, snap)
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
    metered: list[float]
    all_timed: list[float]
    frozen: list[float]
    top16: list[float]
    plugins: list[float]
    floor: list[float]

    def cells(self) -> tuple[str, ...]:
        p50 = percentile(self.base, 0.5)
        plugins = percentile(self.plugins, 0.5)
        return (
            f"{self.n:,}",
            f"{1 / statistics.fmean(self.base):,.0f}",
            us(p50),
            us(percentile(self.base, 0.99)),
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
    gpus, snap = fleet(n, rng)
    plain = build_profile()
    metered = build_profile(metrics=RoutingMetrics(new_registry()))
    req = RouteRequest(request_id="check", model=MODEL, input_tokens=2_000, tenant="t")
    if plain.run(req, gpus, snap).choice != hand_rolled(req, gpus, snap):
        raise SystemExit(f"{n} candidates: the profile and the hand-written floor disagree")
    min_runs = 20 if n >= 10_000 else 100
    half = (budget / 2, min_runs // 2)
    base = measure(plain.run, gpus, snap, budget, min_runs)
    with_metrics = measure(metered.run, gpus, snap, *half)
    try:
        timed_profile = build_profile(metrics=RoutingMetrics(new_registry()), plugin_timing_every=1)
        all_timed = measure(timed_profile.run, gpus, snap, *half)
    except TypeError:  # a framework without plugin_timing_every times every decision
        all_timed = with_metrics
    top16 = measure(build_profile(trace_scores=16).run, gpus, snap, *half)
    plugins = measure(plugins_only(gpus, snap), gpus, snap, *half)
    floor = measure(hand_rolled, gpus, snap, *half)
    gc.freeze()
    frozen = measure(plain.run, gpus, snap, *half)
    gc.unfreeze()
    return Row(n, base, with_metrics, all_timed, frozen, top16, plugins, floor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run for CI")
    args = parser.parse_args()
    budget = 0.25 if args.smoke else 3.0
    rng = random.Random(20_260_101)
    print(
        "Profile.run: 3 filters, 3 scorers, max-score picker, latencies in µs "
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

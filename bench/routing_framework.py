"""Cost of one routing decision: Profile.run over 10 … 10,000 candidates.

The profile is a realistic zone-agent shape: 3 filters (allow-list from the snapshot,
health, model served), 3 scorers (queue, KV-cache headroom, predicted TTFT — which is also
the cost model), and the max-score picker. About 10 % of candidates are filtered out.

Printed per size: decisions/s, p50 and p99 latency, p50 with Prometheus metrics on, p50
when the trace keeps only the 16 best candidates' scores (``trace_scores``), and the ratio
of the p50 to a hand-written function that computes the same choice with no framework and
no trace (the floor any framework pays on top of). The p99 is dominated by CPython's
cyclic garbage collector walking every long-lived object; "p99 frozen" is measured after
``gc.freeze()``, which a server calls once after start-up to take its long-lived objects
out of those walks.

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
from gtm.routing import FilterResult, Profile, RoutingMetrics, WeightedScorer
from gtm.routing.cost import predicted_ttft_ms, scores_from_costs
from gtm.routing.filters.allow_list import AllowListFilter
from gtm.routing.filters.allow_list import Params as AllowParams
from gtm.routing.pickers.max_score import MaxScorePicker

SIZES = (10, 100, 1_000, 10_000)
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
        kept = tuple(c for c in candidates if c.healthy)
        if len(kept) == len(candidates):
            return FilterResult(kept)
        removed = tuple((c.id, "unhealthy") for c in candidates if not c.healthy)
        return FilterResult(kept, removed)


class ModelFilter:
    name = "model"

    def filter(
        self, request: RouteRequest, candidates: Sequence[Gpu], ctx: Snapshot, /
    ) -> FilterResult[Gpu]:
        model = request.model
        kept = tuple(c for c in candidates if model in c.models)
        if len(kept) == len(candidates):
            return FilterResult(kept)
        removed = tuple((c.id, "model not loaded") for c in candidates if model not in c.models)
        return FilterResult(kept, removed)


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
        return scores_from_costs(
            {c.id: self.cost_ms(request, c, ctx) for c in candidates}, SCALE_MS
        )


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
    metrics: RoutingMetrics | None = None, trace_scores: int | None = None
) -> Profile[Gpu, Snapshot]:
    ttft = TtftScorer()
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
    )


def hand_rolled(request: RouteRequest, gpus: Sequence[Gpu], snap: Snapshot) -> str:
    """The same choice, written as one function with no framework and no trace."""
    live = [g for g in gpus if g.id in snap.allowed and g.healthy and request.model in g.models]
    queue = QueueScorer().score(request, live, snap)
    ttft = TtftScorer().score(request, live, snap)
    totals = {g.id: (queue[g.id] + g.kv_free + 2 * ttft[g.id]) / 4 for g in live}
    top = max(totals.values())
    return min(cid for cid, total in totals.items() if total == top)


Decide = Callable[[RouteRequest, Sequence[Gpu], Snapshot], object]


def measure(
    decide: Decide, gpus: Sequence[Gpu], snap: Snapshot, budget_s: float, min_runs: int
) -> list[float]:
    """Per-decision seconds, each request with its own id, for at least ``budget_s``."""
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    i = 0
    while i < min_runs or time.perf_counter() < deadline:
        request = RouteRequest(request_id=f"r{i}", model=MODEL, input_tokens=2_000, tenant="t")
        start = time.perf_counter()
        decide(request, gpus, snap)
        samples.append(time.perf_counter() - start)
        i += 1
    return samples


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run for CI")
    args = parser.parse_args()
    budget = 0.25 if args.smoke else 3.0
    rng = random.Random(20_260_101)
    plain = build_profile()
    metered = build_profile(metrics=RoutingMetrics(new_registry()))
    short_trace = build_profile(trace_scores=16)

    print(
        f"Profile.run: 3 filters, 3 scorers, max-score picker ({'smoke' if args.smoke else 'full'})"
    )
    print(
        f"{'candidates':>10} {'decisions/s':>12} {'p50 µs':>10} {'p99 µs':>10} "
        f"{'p99 frozen':>11} {'µs/100 cand':>12} {'p50 +metrics':>13} {'p50 top-16':>11} "
        f"{'× hand-rolled':>14}"
    )
    for n in SIZES:
        gpus, snap = fleet(n, rng)
        req = RouteRequest(request_id="check", model=MODEL, input_tokens=2_000, tenant="t")
        if plain.run(req, gpus, snap).choice != hand_rolled(req, gpus, snap):
            raise SystemExit(f"{n} candidates: the profile and the hand-written floor disagree")
        min_runs = 20 if n >= 10_000 else 100
        base = measure(plain.run, gpus, snap, budget, min_runs)
        with_metrics = measure(metered.run, gpus, snap, budget / 2, min_runs // 2)
        top16 = measure(short_trace.run, gpus, snap, budget / 2, min_runs // 2)
        floor = measure(hand_rolled, gpus, snap, budget / 2, min_runs // 2)
        gc.freeze()
        frozen = measure(plain.run, gpus, snap, budget / 2, min_runs // 2)
        gc.unfreeze()
        p50 = statistics.median(base)
        print(
            f"{n:>10,} {1 / statistics.fmean(base):>12,.0f} {p50 * 1e6:>10,.1f} "
            f"{quantile(base, 0.99) * 1e6:>10,.1f} {quantile(frozen, 0.99) * 1e6:>11,.1f} "
            f"{p50 * 1e6 * 100 / n:>12,.1f} "
            f"{statistics.median(with_metrics) * 1e6:>13,.1f} "
            f"{statistics.median(top16) * 1e6:>11,.1f} "
            f"{p50 / statistics.median(floor):>14.2f}"
        )


if __name__ == "__main__":
    main()

"""Residency verdicts per second: ``ResidencyEngine.allowed_regions`` on a typical set.

The policy set is the shipped examples (six regions, GDPR deny, healthcare pin, de-only
data class) plus 200 generated tenants, a quarter of them with their own allow rule and
a tenth with a deny, and 20 per-country-and-model rules: about 90 rules in all.
Queries are drawn from 200 tenants × 40 client countries (and unknown) × 4 models ×
3 data classes.

Measured: verdicts/s with the memo cache warm (steady traffic: a bounded working set of
distinct queries), with the verdict memo off (every verdict evaluated over the
pre-filtered per-tenant-and-country rule lists: the worst case, e.g. right after a
policy swap), and a peer — a straightforward evaluator that scans every
rule per request with the same semantics — in the same run. Target: ≥ 200k verdicts/s.

    python bench/residency_verdicts.py           # ~20 s
    python bench/residency_verdicts.py --smoke   # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from policies.documents import Effect, ResidencyDocument, TenantsDocument
from policies.loader import load_examples
from policies.policyset import LoadedDocument, PolicySet, build_policy_set
from policies.residency import ResidencyQuery, compile
from policies.rules import CompiledRule

TARGET = 200_000
# fmt: off
COUNTRIES = [
    "US", "CA", "MX", "BR", "AR", "GB", "IE", "FR", "DE", "NL", "BE", "ES", "IT", "PT", "PL",
    "SE", "NO", "DK", "FI", "CH", "AT", "CZ", "RO", "GR", "TR", "IL", "AE", "SA", "IN", "SG",
    "JP", "KR", "CN", "TW", "HK", "AU", "NZ", "ZA", "NG", "EG",
]
# fmt: on
MODELS = ["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen-2.5-72b"]
DATA_CLASSES = ["default", "pii", "de-only"]


def _doc(model: type[Any], kind: str, name: str, spec: dict[str, Any]) -> LoadedDocument:
    data = {"apiVersion": "gtm.dev/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}
    return LoadedDocument(source=f"bench:{name}", document=model.model_validate(data))


def typical_policy_set(rng: random.Random, tenants: int = 200) -> PolicySet:
    examples = load_examples()
    ids = [f"tenant-{i}" for i in range(tenants)]
    rules: list[dict[str, Any]] = []
    for tid in ids:
        if rng.random() < 0.25:
            jurisdiction = rng.choice(["eu", "us", "eea", "gdpr-adequate"])
            rules.append(
                {
                    "name": f"{tid}-home",
                    "match": {"tenants": [tid]},
                    "effect": "allow",
                    "jurisdictions": [jurisdiction],
                }
            )
        if rng.random() < 0.10:
            rules.append(
                {
                    "name": f"{tid}-not-asia",
                    "match": {"tenants": [tid]},
                    "effect": "deny",
                    "jurisdictions": ["continent-as"],
                }
            )
    for country in rng.sample(COUNTRIES, 20):
        rules.append(
            {
                "name": f"clients-{country.lower()}",
                "match": {"client_countries": [country], "models": [rng.choice(MODELS)]},
                "effect": "allow",
                "regions": [rng.choice(sorted(examples.regions))],
            }
        )
    extra = [
        _doc(TenantsDocument, "Tenants", "bench-tenants", {"tenants": [{"id": t} for t in ids]}),
        _doc(ResidencyDocument, "Residency", "bench-rules", {"rules": rules}),
    ]
    return build_policy_set([*examples.documents, *extra])


def queries(rng: random.Random, policy_set: PolicySet, count: int) -> list[ResidencyQuery]:
    tenants = sorted(policy_set.tenants)
    countries: list[str | None] = [*COUNTRIES, None]
    return [
        ResidencyQuery(
            tenant=rng.choice(tenants),
            model=rng.choice(MODELS),
            data_class=rng.choices(DATA_CLASSES, weights=[90, 8, 2])[0],
            client_country=rng.choice(countries),
        )
        for _ in range(count)
    ]


class ScanEvaluator:
    """The peer: every rule, every request, no index and no cache (same semantics)."""

    def __init__(self, policy_set: PolicySet) -> None:
        self._rules = sorted(policy_set.rules, key=lambda r: -r.specificity)
        unknown = policy_set.settings.unknown_client_location
        self._assumed = (
            policy_set.jurisdictions[unknown.jurisdiction] if unknown.jurisdiction else None
        )

    def allowed(self, q: ResidencyQuery) -> frozenset[str]:
        args = (q.tenant, q.data_class, q.client_country, self._assumed, q.model)
        matching: list[CompiledRule] = [r for r in self._rules if r.matches(*args)]
        base = next((r for r in matching if r.effect is Effect.ALLOW), None)
        if base is None:
            return frozenset()
        allowed = base.regions
        for rule in matching:
            if rule.effect is Effect.DENY:
                allowed = allowed - rule.regions
        return allowed


def measure(call: Callable[[ResidencyQuery], object], work: Sequence[ResidencyQuery]) -> float:
    start = time.perf_counter()
    for query in work:
        call(query)
    return len(work) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="a few seconds (CI)")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    policy_set = typical_policy_set(rng)
    distinct = queries(rng, policy_set, 20_000)
    work = [rng.choice(distinct) for _ in range(200_000 if args.smoke else 2_000_000)]

    cached = compile(policy_set)
    for query in distinct:  # warm: steady traffic has seen its working set
        cached.allowed_regions(query)
    uncached = compile(policy_set, cache_size=0)
    scan = ScanEvaluator(policy_set)
    mismatches = sum(
        uncached.allowed_regions(q).allowed != scan.allowed(q) for q in distinct[:5_000]
    )

    warm = measure(cached.allowed_regions, work)
    cold = measure(uncached.allowed_regions, work[: len(work) // 4])
    peer = measure(scan.allowed, work[: len(work) // 20])
    print(
        f"residency engine: {len(policy_set.rules)} rules, {len(policy_set.tenants)} tenants, "
        f"{len(policy_set.regions)} regions; {len(distinct):,} distinct queries"
    )
    print(f"  cached (steady traffic)        {warm:>12,.0f} verdicts/s")
    print(f"  uncached (every verdict fresh) {cold:>12,.0f} verdicts/s")
    print(f"  peer: scan all rules           {peer:>12,.0f} verdicts/s")
    print(f"  cached / peer {warm / peer:6.1f}x   uncached / peer {cold / peer:6.1f}x")
    for label, value in (("cached", warm), ("uncached", cold)):
        print(
            f"  target ≥ {TARGET:,} verdicts/s ({label}): {'met' if value >= TARGET else 'MISSED'}"
        )
    if mismatches:
        print(f"  ERROR: engine and peer disagree on {mismatches} queries")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())

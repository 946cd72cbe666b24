"""The policies the benchmark compares: a region mode and a zone-agent profile each.

The region mode selects how a request's region is chosen: gtm's tiers, whose **real
decision code** runs in the loop (:mod:`fleetsim.tiers`: :mod:`global_lb.router`,
:mod:`regional_lb.router`), or a cross-region baseline of :mod:`fleetsim.baselines`
(nearest allowed, GeoDNS, GORGO, SkyWalker-like), each the published rule behind one
protocol. The zone profile, one of :data:`zone_agent.profiles.BUILTIN_PROFILES`, picks
the GPU. Sources are listed in ``fleetsim/README.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from global_lb.inflight import LedgerSettings
from zone_agent.flow import AdmissionMode, AdmissionSettings


class RegionMode(StrEnum):
    """How a request's region is chosen."""

    #: gtm: global router (residency, RTT + predicted TTFT) → regional router (zone
    #: choice, spillover inside the allowed set, fair queue) → zone agent.
    GTM = "gtm"
    #: The nearest region the tenant's residency allows, one balancer over its GPUs.
    NEAREST_ALLOWED = "nearest-allowed"
    #: Route 53-like latency routing: the nearest healthy region, residency-blind.
    GEODNS = "geodns"
    #: GORGO (arXiv 2602.11688): forward to a peer iff RTT + unmatched·t_p < local cost.
    GORGO = "gorgo"
    #: SkyWalker-like (EuroSys'26): push to the least-loaded peer when the home
    #: region's pending requests per GPU pass a threshold.
    SKYWALKER = "skywalker"


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    region_mode: RegionMode
    #: The zone agent profile that picks the GPU (inside a zone for gtm, inside the
    #: region's whole pool for the others).
    zone_profile: str
    description: str = ""
    #: gtm's global in-flight ledger (``None``: the defaults, as the front door runs it).
    ledger: LedgerSettings | None = None
    #: gtm's placement memories and sticky rules (a conversation kept on the region,
    #: zone and GPU its prefix was just sent to); False runs its tiers without them.
    affinity: bool = True
    #: The zone agents' flow control (``gtm zone --admission slo``; None: off).
    admission: AdmissionSettings | None = None


def _zone_baseline(name: str, profile: str, what: str) -> PolicySpec:
    return PolicySpec(name, RegionMode.NEAREST_ALLOWED, profile, what)


POLICIES: Mapping[str, PolicySpec] = MappingProxyType(
    {
        p.name: p
        for p in (
            PolicySpec(
                "gtm", RegionMode.GTM, "default", "gtm: global → regional → zone (defaults)"
            ),
            _zone_baseline("round-robin", "round-robin", "nginx round robin"),
            _zone_baseline("least-connections", "least-connections", "nginx least_conn"),
            _zone_baseline(
                "weighted-round-robin", "weighted-round-robin", "WRR by GPU prefill rate"
            ),
            _zone_baseline("least-pending-tokens", "least-pending-tokens", "seeds' balancer"),
            _zone_baseline("consistent-hash", "consistent-hash", "hash of the prompt prefix"),
            _zone_baseline("sglang-cache-aware", "sglang-cache-aware", "SGLang router 0.3/64/1.5"),
            _zone_baseline("llm-d-blend", "llm-d-blend", "llm-d prefix 3 / queue 2 / KV 2"),
            _zone_baseline("dynamo-cost", "dynamo-cost", "Dynamo KV router linear cost"),
            PolicySpec(
                "geodns-least-connections",
                RegionMode.GEODNS,
                "least-connections",
                "Route 53 latency routing + least connections",
            ),
            PolicySpec("gorgo", RegionMode.GORGO, "dynamo-cost", "GORGO cross-region rule"),
            PolicySpec(
                "skywalker",
                RegionMode.SKYWALKER,
                "sglang-cache-aware",
                "SkyWalker-like selective push + prefix tree",
            ),
        )
    }
)

#: Variants of gtm with one mechanism off, to measure what it brings, or a mode on (not
#: baselines: never in the default set, never "the best baseline").
ABLATIONS: Mapping[str, PolicySpec] = MappingProxyType(
    {
        "gtm-no-ledger": PolicySpec(
            "gtm-no-ledger",
            RegionMode.GTM,
            "default",
            "gtm without the global in-flight ledger (summaries alone)",
            ledger=LedgerSettings(enabled=False),
        ),
        "gtm-no-affinity": PolicySpec(
            "gtm-no-affinity",
            RegionMode.GTM,
            "default",
            "gtm without its placement memories: each tier chooses again for a repeat",
            affinity=False,
        ),
        "gtm-ttft-only": PolicySpec(
            "gtm-ttft-only",
            RegionMode.GTM,
            "ttft-only",
            "gtm with the zone's previous default: predicted TTFT alone, no KV-cache room",
        ),
        "gtm-goodput": PolicySpec(
            "gtm-goodput",
            RegionMode.GTM,
            "goodput",
            "gtm with the zone's goodput profile: lateness concentrated when all are late",
        ),
        "gtm-admission": PolicySpec(
            "gtm-admission",
            RegionMode.GTM,
            "default",
            "gtm with the zones' flow control: held while no GPU is within the SLO",
            admission=AdmissionSettings(mode=AdmissionMode.SLO),
        ),
    }
)

#: A short set for smoke runs and tests.
SMOKE_POLICIES = ("gtm", "round-robin", "least-connections", "gorgo")


def policy(name: str) -> PolicySpec:
    found = POLICIES.get(name) or ABLATIONS.get(name)
    if found is None:
        known = ", ".join([*POLICIES, *ABLATIONS])
        raise KeyError(f"unknown policy {name!r}; known: {known}")
    return found

"""Simulated fleets: the six example regions of ``gtm up``, scaled to N GPUs.

Regions (id, location, jurisdiction) come from the policies' Regions document, as for a
live deployment; each region gets ``zones_per_region`` zones and an equal share of the
GPUs, whose types cycle through the example topology's mix of that region
(``gtm/data/example-topology.yaml``), so the fleet stays heterogeneous at any size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gtm.errors import ConfigError
from gtm.models import Region
from gtm.policy_store import ActivePolicy
from gtm.topology import Topology, load_topology, resolve


@dataclass(frozen=True, slots=True)
class ZoneSpec:
    id: str
    #: (gpu id, gpu type) per worker.
    gpus: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RegionSpec:
    id: str
    record: Region
    zones: tuple[ZoneSpec, ...]


@dataclass(frozen=True, slots=True)
class FleetSpec:
    regions: tuple[RegionSpec, ...]

    @property
    def gpu_count(self) -> int:
        return sum(len(z.gpus) for r in self.regions for z in r.zones)

    def gpu_types(self) -> list[str]:
        return [t for r in self.regions for z in r.zones for _, t in z.gpus]


def scaled_fleet(
    policy: ActivePolicy,
    gpus: int,
    regions: int = 6,
    zones_per_region: int = 2,
    weights: Sequence[float] | None = None,
) -> FleetSpec:
    """``gpus`` GPUs over the first ``regions`` regions of the example topology: equal
    shares, or in proportion to ``weights`` (one per region, e.g. the demand nearest
    to each; every region keeps at least one GPU per zone)."""
    topology = load_topology()
    specs = topology.regions[:regions]
    if not specs or regions < 1:
        raise ConfigError("need at least one region")
    if gpus < len(specs) * zones_per_region:
        raise ConfigError(
            f"{gpus} GPUs cannot give each of {len(specs)} regions × {zones_per_region} "
            "zones one GPU"
        )
    known = {r.id: r for r in _policy_regions(policy)}
    shares = _shares(gpus, len(specs), zones_per_region, weights)
    out: list[RegionSpec] = []
    for ri, spec in enumerate(specs):
        record = known.get(spec.id)
        if record is None:
            raise ConfigError(f"region {spec.id} is not in the policies' Regions")
        mix = [g.type for z in spec.zones for g in z.gpus for _ in range(g.count)]
        share = shares[ri]
        zones = []
        for zi in range(zones_per_region):
            count = share // zones_per_region + (1 if zi < share % zones_per_region else 0)
            zone_id = f"{spec.id}-{chr(ord('a') + zi)}"
            zones.append(
                ZoneSpec(
                    zone_id,
                    tuple((f"{zone_id}-g{k:04d}", mix[(k + zi) % len(mix)]) for k in range(count)),
                )
            )
        out.append(RegionSpec(spec.id, record, tuple(zones)))
    return FleetSpec(tuple(out))


def fleet_from_topology(policy: ActivePolicy, topology: Topology, model: str) -> FleetSpec:
    """Exactly the GPUs of a ``gtm up`` topology that serve ``model`` (ids as placed)."""
    deployment = resolve(topology, policy.policy_set.regions)
    out: list[RegionSpec] = []
    for region in deployment.regions:
        zones = tuple(
            ZoneSpec(z.id, tuple((g.id, g.gpu_type) for g in z.gpus if model in g.models))
            for z in region.zones
        )
        zones = tuple(z for z in zones if z.gpus)
        if zones:
            out.append(RegionSpec(region.id, region.region, zones))
    if not out:
        raise ConfigError(f"no GPU of the topology serves {model}")
    return FleetSpec(tuple(out))


def _shares(gpus: int, regions: int, floor: int, weights: Sequence[float] | None) -> list[int]:
    """GPUs per region: ``floor`` each, the rest by largest remainder of ``weights``."""
    if weights is None:
        return [gpus // regions + (1 if ri < gpus % regions else 0) for ri in range(regions)]
    if len(weights) < regions or any(w < 0 for w in weights[:regions]):
        raise ConfigError(f"need {regions} non-negative region weights, got {list(weights)}")
    w = [float(x) for x in weights[:regions]]
    total = sum(w) or 1.0
    spare = gpus - floor * regions
    exact = [spare * x / total for x in w]
    out = [floor + int(e) for e in exact]
    by_remainder = sorted(range(regions), key=lambda k: (-(exact[k] - int(exact[k])), k))
    for k in by_remainder[: gpus - sum(out)]:
        out[k] += 1
    return out


def _policy_regions(policy: ActivePolicy) -> list[Region]:
    from global_lb.view import policy_regions

    return list(policy_regions(policy).values())

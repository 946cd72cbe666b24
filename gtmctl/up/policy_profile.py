"""``gtm up --policy-profile NAME``: every tier runs one of the simulator's policies.

The fleet simulator compares gtm with baselines by name (:mod:`fleetsim.policies`: a
region mode, a zone-agent profile, gtm's placement memories on or off). A live
comparison must run the same policy at each tier, so this maps a simulator policy to
what each daemon ``gtm up`` starts is configured with (:class:`TierPolicy`), the way
:mod:`fleetsim.simulator` maps it to its routing:

* **gtm's region mode** (``gtm``, ``gtm-no-affinity``, ``gtm-ttft-only``): the global
  tier's default profile, regional spillover, the policy's zone profile, and gtm's
  placement memories and sticky rules at all three tiers when the policy keeps them
  (:attr:`fleetsim.policies.PolicySpec.affinity`: the front door's region memory, the
  regional LB's zone memory, the zone agent's sticky GPU).
* **nearest-allowed** (the zone-agent baselines: ``llm-d-blend``, ``sglang-cache-aware``,
  ``round-robin``, …): the simulator sends each request to the nearest region its
  residency allows and hands it to the baseline's balancer over that region's whole
  pool (:class:`fleetsim.routing.Baseline`). Live: the front door runs
  ``global-nearest`` (round trip alone), no region spills, each region's GPUs are pooled
  under one zone agent running the baseline profile (:func:`pooled`), and no tier keeps
  gtm's placement memories (the baselines are compared as published). The regional LB
  still admits (quotas) and queues what its one zone cannot take yet: the API gateway
  the simulator puts in front of every balancer, with a queue the simulator's
  baselines leave to the GPUs.

Policies whose region rule has no live counterpart (GeoDNS, GORGO, SkyWalker-like) or
that change the front door's in-flight ledger (``gtm-no-ledger``) are not offered.
Without the option every tier runs its defaults, as before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from global_lb.profile_names import NEAREST_PROFILE_NAME, REQUEST_PROFILE_NAME
from gtm.errors import ConfigError
from gtm.models import Frozen
from gtm.topology import RegionSpec, Topology, ZoneSpec
from zone_agent.profile_names import DEFAULT_PROFILE


class TierPolicy(Frozen):
    """What each tier of a ``gtm up`` deployment runs (the defaults: gtm as shipped)."""

    #: The simulator policy this stands for ("": none given, the defaults).
    name: str = ""
    #: The front door's routing profile (``gtm global --profile``).
    global_profile: str = REQUEST_PROFILE_NAME
    #: gtm's placement memories and sticky rules at every tier (``--no-affinity``).
    affinity: bool = True
    #: Regional LBs pass requests to peer regions (``gtm regional --no-spill``).
    spill: bool = True
    #: The zone agents' profile (``gtm zone --profile``).
    zone_profile: str = DEFAULT_PROFILE
    #: Each region's GPUs pooled under one zone agent (:func:`pooled`).
    region_pool: bool = False

    # The daemons' flags for what differs from their defaults (``gtm up --processes``;
    # none without --policy-profile, so their command lines stay as they were).

    def global_flags(self) -> list[str]:
        flags = [] if self.affinity else ["--no-affinity"]
        if self.global_profile != REQUEST_PROFILE_NAME:
            flags += ["--profile", self.global_profile]
        return flags

    def regional_flags(self) -> list[str]:
        return [
            *([] if self.affinity else ["--no-affinity"]),
            *([] if self.spill else ["--no-spill"]),
        ]

    def zone_flags(self) -> list[str]:
        flags = [] if self.affinity else ["--no-affinity"]
        if self.zone_profile != DEFAULT_PROFILE:
            flags += ["--profile", self.zone_profile]
        return flags


def live_policies() -> Mapping[str, TierPolicy]:
    """Every simulator policy that has a live form, by name."""
    # Imported here: `gtm up` without the option never loads the simulator.
    from fleetsim.policies import ABLATIONS, POLICIES, RegionMode

    found: dict[str, TierPolicy] = {}
    for spec in (*POLICIES.values(), *ABLATIONS.values()):
        if spec.region_mode is RegionMode.GTM and spec.ledger is None:
            found[spec.name] = TierPolicy(
                name=spec.name, affinity=spec.affinity, zone_profile=spec.zone_profile
            )
        elif spec.region_mode is RegionMode.NEAREST_ALLOWED:
            found[spec.name] = TierPolicy(
                name=spec.name,
                global_profile=NEAREST_PROFILE_NAME,
                affinity=False,
                spill=False,
                zone_profile=spec.zone_profile,
                region_pool=True,
            )
    return MappingProxyType(found)


def tier_policy(name: str | None) -> TierPolicy:
    """The tiers' settings for simulator policy ``name`` (``None``: the defaults); a
    ConfigError naming the known policies for any other name."""
    if name is None:
        return TierPolicy()
    known = live_policies()
    found = known.get(name)
    if found is None:
        raise ConfigError(f"unknown policy profile {name!r}; known: {', '.join(known)}")
    return found


def pooled(topology: Topology) -> Topology:
    """``topology`` with each region's GPUs under one zone (its first zone's id and
    port): one balancer per region, as the simulator pools them for a baseline."""
    regions = tuple(
        RegionSpec(
            id=region.id,
            address=region.address,
            zones=(
                ZoneSpec(
                    id=region.zones[0].id,
                    gpus=tuple(g for z in region.zones for g in z.gpus),
                    port=topology.zone_port(region, region.zones[0]),
                ),
            ),
        )
        for region in topology.regions
    )
    return Topology(
        regions=regions,
        models=topology.models,
        regional_port=topology.regional_port,
        zone_port_base=topology.zone_port_base,
    )

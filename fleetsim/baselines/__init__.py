"""Cross-region baselines: the published rules gtm is compared with, one module each,
behind one protocol (:class:`~fleetsim.baselines.base.RegionPolicy`).

A policy's :attr:`~fleetsim.policies.PolicySpec.region_mode` selects its rule here;
inside the chosen region a zone-agent baseline profile picks the GPU, as the zone
baselines are plugins of :mod:`zone_agent.profiles`. gtm itself is not a rule here: it
runs the tiers' own decision code (:mod:`fleetsim.tiers`). To add a baseline, write a
module with a class that has ``arrival_only`` and ``choose``, add a
:class:`~fleetsim.policies.RegionMode` and register the class below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from fleetsim.baselines.base import Placement, RegionLoad, RegionPolicy, Regions
from fleetsim.baselines.geodns import GeoDns
from fleetsim.baselines.gorgo import Gorgo
from fleetsim.baselines.nearest import NearestAllowed
from fleetsim.baselines.skywalker import SkyWalker
from fleetsim.policies import RegionMode
from gtm.errors import ConfigError

__all__ = ["REGION_POLICIES", "Placement", "RegionLoad", "RegionPolicy", "Regions", "region_policy"]

#: Every cross-region baseline, by the region mode that selects it.
REGION_POLICIES: Mapping[RegionMode, Callable[[], RegionPolicy]] = MappingProxyType(
    {
        RegionMode.NEAREST_ALLOWED: NearestAllowed,
        RegionMode.GEODNS: GeoDns,
        RegionMode.GORGO: Gorgo,
        RegionMode.SKYWALKER: SkyWalker,
    }
)


def region_policy(mode: RegionMode) -> RegionPolicy:
    """The cross-region rule ``mode`` selects."""
    make = REGION_POLICIES.get(mode)
    if make is None:
        raise ConfigError(f"no cross-region baseline for region mode {mode.value!r}")
    return make()

"""``nearest-allowed``: the region nearest the client among those the tenant's
residency allows, with no cross-region rule (the zone-agent baselines' region choice:
one balancer per region, clients sent to the closest permitted one)."""

from __future__ import annotations

from typing import ClassVar

from fleetsim.baselines.base import Placement, Regions, nearest_allowed
from fleetsim.workload import SimRequest
from policies import Verdict


class NearestAllowed:
    arrival_only: ClassVar[bool] = True

    def choose(self, req: SimRequest, verdict: Verdict, regions: Regions) -> Placement | None:
        return nearest_allowed(req, verdict, regions)

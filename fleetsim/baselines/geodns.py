"""``geodns``: Route 53-style latency routing — the region nearest the client,
residency-blind (AWS Route 53 latency-based routing). A request it sends where the
tenant's data may not go counts as a residency violation, never as a refusal."""

from __future__ import annotations

from typing import ClassVar

from fleetsim.baselines.base import Placement, Regions
from fleetsim.workload import SimRequest
from policies import Verdict


class GeoDns:
    arrival_only: ClassVar[bool] = True

    def choose(self, req: SimRequest, verdict: Verdict, regions: Regions) -> Placement | None:
        home = regions.nearest(req, regions.region_ids)
        if home is None:
            return None
        return Placement(home, home, regions.client_rtt_ms(req, home))

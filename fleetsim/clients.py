"""What the simulator knows of a request's client: the residency engine's verdict, the
round trip to each region, the nearest region, what the routers see of it — each
memoised per tenant and country or per client place (clients repeat: cities)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleetsim.workload import SimRequest
from gtm.models import ClientInfo, Region
from gtm.policy_store import ActivePolicy
from gtm.routing.cost import rtt_ms_from_distance
from policies import ResidencyQuery, Verdict


class Clients:
    """The clients of one run. ``network`` False: no client RTT is added to latencies
    (a loopback deployment), though the nearest region is still the nearest."""

    def __init__(
        self, policy: ActivePolicy, model: str, regions: Mapping[str, Region], network: bool
    ) -> None:
        self.policy = policy
        self.model = model
        self.regions = regions
        self.region_ids = tuple(regions)
        self.region_index = {r: k for k, r in enumerate(self.region_ids)}
        self.network = network
        self._verdicts: dict[tuple[str, str], Verdict] = {}
        self._rtt: dict[tuple[int, str], float] = {}
        self._home: dict[int, int] = {}
        self._client: dict[int, ClientInfo] = {}

    def verdict(self, tenant: str, country: str) -> Verdict:
        """The residency engine's answer for ``tenant``'s requests from ``country``."""
        key = (tenant, country)
        found = self._verdicts.get(key)
        if found is None:
            query = ResidencyQuery(tenant, self.model, "default", country)
            found = self._verdicts[key] = self.policy.engine.allowed_regions(query)
        return found

    def client_rtt(self, req: SimRequest, region: str) -> float:
        """Client↔region RTT added to the request's latency (0 without a network)."""
        return self._fitted_rtt(req, region) if self.network else 0.0

    def _fitted_rtt(self, req: SimRequest, region: str) -> float:
        key = (req.place_id, region)
        found = self._rtt.get(key)
        if found is None:
            km = req.point.distance_km(self.regions[region].location)
            found = self._rtt[key] = rtt_ms_from_distance(km)
        return found

    def home_of(self, req: SimRequest) -> int:
        """The region nearest the client (index): what cross-region is measured from."""
        found = self._home.get(req.place_id)
        if found is None:
            nearest = self.nearest(req, self.region_ids) or self.region_ids[0]
            found = self._home[req.place_id] = self.region_index[nearest]
        return found

    def info(self, req: SimRequest) -> ClientInfo:
        """What the routers know of ``req``'s client (country and location)."""
        found = self._client.get(req.place_id)
        if found is None:
            found = self._client[req.place_id] = ClientInfo.model_construct(
                ip=None, country=req.country, location=req.point
            )
        return found

    def nearest(self, req: SimRequest, among: Sequence[str]) -> str | None:
        """The region of ``among`` with the shortest fitted client RTT (network or not)."""
        best = None
        for r in among:
            rtt = self._fitted_rtt(req, r)
            if best is None or rtt < best[0]:
                best = (rtt, r)
        return None if best is None else best[1]

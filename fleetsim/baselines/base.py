"""The cross-region baselines' extension point: what a rule reads and what it returns.

A :class:`RegionPolicy` chooses, for one arrival, the region that serves it and the
latency its choice adds; it reads the fleet only through :class:`Regions` (where the
regions are, the measured latencies, each region's live load as its balancer sees
it). It never touches the event loop: the simulator checks the region's quotas and
hands the request to the zone-agent baseline profile of the policy
(:attr:`fleetsim.policies.PolicySpec.zone_profile`) over the region's whole pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple, Protocol

from fleetsim.workload import SimRequest
from policies import Verdict


class RegionLoad(Protocol):
    """A region's live state as a balancer in front of its whole pool sees it."""

    #: Prompt tokens of the requests past their first token (decoding).
    running_tokens: float

    @property
    def gpu_count(self) -> int: ...

    def pending_tokens(self) -> float:
        """Prefill tokens sent and not yet prefilled, over the region's GPUs."""
        ...

    def prefilling_requests(self) -> float:
        """Requests sent that have no first token yet, over the region's GPUs."""
        ...

    def matched_blocks(self, hashes: tuple[int, ...]) -> int:
        """Prompt blocks of ``hashes`` already cached on the region's best GPU."""
        ...


class Regions(Protocol):
    """The fleet as a cross-region rule sees it at an arrival."""

    @property
    def region_ids(self) -> tuple[str, ...]: ...

    def nearest(self, req: SimRequest, among: Sequence[str]) -> str | None:
        """The region of ``among`` with the shortest client round trip (``None``: empty)."""
        ...

    def client_rtt_ms(self, req: SimRequest, region: str) -> float:
        """The client↔region round trip added to the request's latency (0 on loopback)."""
        ...

    def rtt_ms(self, a: str, b: str) -> float:
        """The measured round trip from region ``a`` to region ``b``."""
        ...

    def load(self, region: str) -> RegionLoad: ...


class Placement(NamedTuple):
    """Where a baseline sends a request."""

    #: The region the client reached first (its rule's starting point).
    home: str
    #: The region that serves it (``home``, or a peer it forwarded to).
    region: str
    #: Latency added to its TTFT and end-to-end time (ms): the client's round trip to
    #: ``home`` and, when forwarded, the round trip to the peer.
    extra_ms: float


class RegionPolicy(Protocol):
    """A cross-region baseline: which region serves a request."""

    #: The choice depends on the arrival alone, never on a region's live state: a
    #: run's regions can then be simulated in separate processes (fleetsim.partition).
    arrival_only: ClassVar[bool]

    def choose(self, req: SimRequest, verdict: Verdict, regions: Regions) -> Placement | None:
        """The region for ``req`` (``None``: refused, the tenant's residency allows no
        region). ``verdict`` is the residency engine's answer for the request."""
        ...


def nearest_allowed(req: SimRequest, verdict: Verdict, regions: Regions) -> Placement | None:
    """The nearest region the tenant's residency allows, the client's round trip added
    (``None``: it allows none of the fleet's regions)."""
    home = regions.nearest(req, [r for r in regions.region_ids if r in verdict.allowed])
    if home is None:
        return None
    return Placement(home, home, regions.client_rtt_ms(req, home))


class PeerForwarding:
    """A rule that starts at the nearest allowed region and may forward the request to
    another allowed region (a *peer*) by reading the regions' live load."""

    arrival_only: ClassVar[bool] = False

    def choose(self, req: SimRequest, verdict: Verdict, regions: Regions) -> Placement | None:
        start = nearest_allowed(req, verdict, regions)
        if start is None:
            return None
        home = start.home
        peers = [r for r in regions.region_ids if r != home and r in verdict.allowed]
        return self.forward(req, start, peers, regions) if peers else start

    def forward(
        self, req: SimRequest, start: Placement, peers: Sequence[str], regions: Regions
    ) -> Placement:
        """Where the request goes from ``start`` (itself, or one of ``peers``, the allowed
        regions other than home in fleet order, never empty)."""
        raise NotImplementedError

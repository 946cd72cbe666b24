"""``skywalker``: a SkyWalker-like selective push (EuroSys'26, arXiv 2505.24095).

From the nearest allowed region, push to the least-loaded allowed peer (fewest
requests waiting for their first token per GPU, then the shortest round trip) when
home has at least :data:`SKYWALKER_PUSH_AT` of them per GPU and the peer at most
:data:`SKYWALKER_PEER_MAX`. The thresholds are our assumption; SkyWalker pushes on
pending requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetsim.baselines.base import PeerForwarding, Placement, Regions
from fleetsim.workload import SimRequest

#: Home region's queued requests per GPU above which it pushes (assumption).
SKYWALKER_PUSH_AT = 2.0
#: The most queued requests per GPU a peer may have to receive a push (assumption).
SKYWALKER_PEER_MAX = 1.0


def queued_per_gpu(region: str, regions: Regions) -> float:
    """Requests waiting for their first token in ``region``, per GPU."""
    load = regions.load(region)
    return load.prefilling_requests() / max(1, load.gpu_count)


class SkyWalker(PeerForwarding):
    def forward(
        self, req: SimRequest, start: Placement, peers: Sequence[str], regions: Regions
    ) -> Placement:
        home = start.home
        if queued_per_gpu(home, regions) < SKYWALKER_PUSH_AT:
            return start
        best = min(peers, key=lambda r: (queued_per_gpu(r, regions), regions.rtt_ms(home, r)))
        if queued_per_gpu(best, regions) > SKYWALKER_PEER_MAX:
            return start
        return Placement(home, best, start.extra_ms + regions.rtt_ms(home, best))

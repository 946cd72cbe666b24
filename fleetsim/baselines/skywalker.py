"""``skywalker``: a SkyWalker-like selective push (EuroSys'26, arXiv 2505.24095).

From the nearest allowed region, push to the least-loaded allowed peer (fewest
requests waiting for their first token per GPU, then the shortest round trip) when
home has at least :data:`SKYWALKER_PUSH_AT` of them per GPU and the peer at most
:data:`SKYWALKER_PEER_MAX`. The thresholds are our assumption; SkyWalker pushes on
pending requests.
"""

from __future__ import annotations

from typing import ClassVar

from fleetsim.baselines.base import Placement, Regions, allowed_peers, nearest_allowed
from fleetsim.workload import SimRequest
from policies import Verdict

#: Home region's queued requests per GPU above which it pushes (assumption).
SKYWALKER_PUSH_AT = 2.0
#: The most queued requests per GPU a peer may have to receive a push (assumption).
SKYWALKER_PEER_MAX = 1.0


def queued_per_gpu(region: str, regions: Regions) -> float:
    """Requests waiting for their first token in ``region``, per GPU."""
    load = regions.load(region)
    return load.prefilling_requests() / max(1, load.gpu_count)


class SkyWalker:
    arrival_only: ClassVar[bool] = False

    def choose(self, req: SimRequest, verdict: Verdict, regions: Regions) -> Placement | None:
        start = nearest_allowed(req, verdict, regions)
        if start is None:
            return None
        home = start.home
        peers = allowed_peers(home, verdict, regions)
        if not peers or queued_per_gpu(home, regions) < SKYWALKER_PUSH_AT:
            return start
        best = min(peers, key=lambda r: (queued_per_gpu(r, regions), regions.rtt_ms(home, r)))
        if queued_per_gpu(best, regions) > SKYWALKER_PEER_MAX:
            return start
        return Placement(home, best, start.extra_ms + regions.rtt_ms(home, best))

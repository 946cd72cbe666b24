"""``gorgo``: GORGO's cross-region rule (arXiv 2602.11688; atoniolo76/gotoni
``pkg/cluster/loadbalancer.go``).

From the nearest allowed region, forward to an allowed peer iff the round trip to it
plus its cost beats the local cost, a region's cost being, per GPU,
``t_p · (queued prefill tokens + ½ running tokens + the prompt's unmatched tokens)``.
Peers are tried in fleet order and the first strictly cheapest wins.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetsim.baselines.base import PeerForwarding, Placement, Regions
from fleetsim.workload import SimRequest

#: GORGO's default prefill cost per token (atoniolo76/gotoni, pkg/config/constants.go).
GORGO_TP_MS = 0.094


def region_cost_ms(req: SimRequest, region: str, regions: Regions) -> float:
    """GORGO's local cost of serving ``req`` in ``region`` (ms)."""
    load = regions.load(region)
    gpus = max(1, load.gpu_count)
    queued = load.pending_tokens() / gpus
    running = load.running_tokens / gpus
    unmatched = max(
        0.0, req.input_tokens - load.matched_blocks(req.prefix_hashes) * req.block_tokens
    )
    return GORGO_TP_MS * (queued + 0.5 * running + unmatched)


class Gorgo(PeerForwarding):
    def forward(
        self, req: SimRequest, start: Placement, peers: Sequence[str], regions: Regions
    ) -> Placement:
        home = start.home
        best_cost, best, extra = region_cost_ms(req, home, regions), home, start.extra_ms
        for peer in peers:
            cost = region_cost_ms(req, peer, regions)
            rtt = regions.rtt_ms(home, peer)
            # Forward iff RTT_peer + the peer's cost beats the local cost.
            if rtt + cost < best_cost:
                best_cost, best, extra = rtt + cost, peer, start.extra_ms + rtt
        return Placement(home, best, extra)

"""How requests reach a region and a zone agent: what the event loop asks of a policy.

The loop (:mod:`fleetsim.simulator`) owns time, the GPUs, the arrivals and the
accounting; a :class:`Routing` owns the decisions. Two kinds exist: gtm's tiers
(:class:`fleetsim.tiers.Tiers`: the global, regional and zone decision code over the
simulated views, with summaries, spills and fair queues) and :class:`Baseline` (a
cross-region rule of :mod:`fleetsim.baselines`, then a zone-agent baseline profile over
the region's whole pool). The policy's :class:`~fleetsim.policies.PolicySpec` picks
one (:func:`fleetsim.simulator.routing_for`); the loop never asks which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from fleetsim.baselines import RegionPolicy
from fleetsim.events import Hop
from fleetsim.pools import Pool
from fleetsim.results import Status
from fleetsim.workload import SimRequest
from gtm.errors import SimulationError
from policies import Verdict

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fleetsim.simulator import Simulator
    from zone_agent.router import ZoneDecision


class Routing:
    """The decisions of one policy in a run; the loop calls these hooks."""

    #: One pool per zone (a zone agent each); otherwise one per region (a balancer over
    #: the region's whole pool).
    ZONE_POOLS: ClassVar[bool] = False
    #: A global tier chooses every arrival's region before the region decides, and
    #: requests may then move between regions (spills, :class:`~fleetsim.events.Hop`).
    #: A partitioned run's worker 0 makes the global choices and feeds the others.
    GLOBAL_TIER: ClassVar[bool] = False

    sim: Simulator

    def attach(self, sim: Simulator) -> None:
        """Set up over ``sim``'s pools (called once, when the simulator is built)."""
        self.sim = sim

    @property
    def partitionable(self) -> bool:
        """Whether a run's regions can be simulated in separate processes."""
        return True

    def arrive(self, i: int, now: float, verdict: Verdict) -> None:
        """Request ``i`` arrives at ``now``; ``verdict``: its residency."""
        raise NotImplementedError

    def publish(self, now: float) -> None:
        """The summary tick at ``now``: what the live publishers do every second."""

    def place_waiting(self, region: str, now: float) -> None:
        """Work finished in ``region`` (or a tick came): place what waits there."""

    def waiting(self) -> bool:
        """Whether any request waits in a queue."""
        return False

    def end_waiting(self) -> None:
        """The horizon: end every request still waiting in a queue."""

    def probe(self, until: float) -> dict[str, int]:
        """Requests per region among the arrivals before ``until``, by the region choice
        alone (run in the partition probe's process: it may change the simulator)."""
        raise NotImplementedError

    def on_hop(self, hop: Hop) -> None:
        """A spilled request reaches its peer (:attr:`GLOBAL_TIER` routings only)."""
        raise SimulationError(f"{type(self).__name__} never spills between regions")

    def enter_fed(self, at: float, i: int, region: str) -> None:
        """A partitioned run's arrival, its region already chosen by worker 0, enters
        it (:attr:`GLOBAL_TIER` routings only)."""
        raise SimulationError(f"{type(self).__name__} has no global tier")

    def decide_until(
        self, barrier: float, inclusive: bool, workers: int, worker_of: Mapping[str, int]
    ) -> list[list[tuple[float, int, str]]]:
        """The global choices for the arrivals before ``barrier`` (at it too if
        ``inclusive``), per worker of a partitioned run (:attr:`GLOBAL_TIER` only)."""
        raise SimulationError(f"{type(self).__name__} has no global tier")

    def zone_choice(self, decision: ZoneDecision) -> ZoneDecision:
        """What the zone agent's edge makes of its profile's ``decision`` before it
        dispatches (gtm: :func:`zone_agent.prefix.sticky_gpu`); the decision itself
        by default."""
        return decision


class Baseline(Routing):
    """A cross-region rule, then the quota check of the region it chose (the API gateway
    in front of the region's balancer), then the policy's zone-agent baseline profile
    over that region's whole pool. Also the :class:`~fleetsim.baselines.Regions` the
    rule reads."""

    def __init__(self, rule: RegionPolicy) -> None:
        self.rule = rule

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        self.region_ids = sim.region_ids

    @property
    def partitionable(self) -> bool:
        return self.rule.arrival_only

    def arrive(self, i: int, now: float, verdict: Verdict) -> None:
        sim = self.sim
        placed = self.rule.choose(sim.requests[i], verdict, self)
        if placed is None:
            sim.end(i, Status.REFUSED, "residency")
            return
        if placed.region not in sim.owned:
            return  # another process of a partitioned run simulates it
        if placed.region != placed.home:
            sim.spills += 1
        if sim.admit(i, placed.region, now):
            sim.dispatch(i, sim.region_pools[placed.region][0], now, placed.extra_ms)

    def probe(self, until: float) -> dict[str, int]:
        sim = self.sim
        counts = dict.fromkeys(sim.region_ids, 0)
        for req in sim.requests:
            if req.at_s >= until:
                break
            placed = self.rule.choose(req, sim.clients.verdict(req.tenant, req.country), self)
            if placed is not None:
                counts[placed.region] += 1
        return counts

    # ------------------------------------------------------------ what the rule reads

    def nearest(self, req: SimRequest, among: Sequence[str]) -> str | None:
        return self.sim.clients.nearest(req, among)

    def client_rtt_ms(self, req: SimRequest, region: str) -> float:
        return self.sim.clients.client_rtt(req, region)

    def rtt_ms(self, a: str, b: str) -> float:
        return self.sim.rtt.between(a, b)

    def load(self, region: str) -> Pool:
        return self.sim.region_pools[region][0]

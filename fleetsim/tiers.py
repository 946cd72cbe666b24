"""gtm's tiers in the loop: the global, regional and zone decision code, called over the
simulated views exactly as the live services call it.

Per request: residency verdict (:mod:`policies`) → :class:`GlobalRouter` ``.decide``
over the global view and its in-flight ledger → the chosen region's quota check →
:class:`RegionalRouter` ``.decide`` (LOCAL / SPILL to a peer, decided again there / QUEUE
in the region's fair queue, re-placed with ``.place`` when work finishes and at ticks /
REFUSE) → the zone agent's :class:`~zone_agent.router.ZoneProfile` ``.decide``
(:meth:`fleetsim.simulator.Simulator.dispatch`). Every tick the zone summaries, the
regional views and region summaries, then the global view are rebuilt, as the live
publishers do once a second.

The global tier's choices depend on the global view and its ledger alone (charged at
the forward, before the region's quota check, as the front door charges): a
partitioned run's worker 0 makes all of them ahead of the others
(:meth:`Tiers.decide_until`, :mod:`fleetsim.partition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter_ns
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from fleetsim.events import Hop
from fleetsim.results import Status
from fleetsim.routing import Routing
from global_lb.health import HealthTable
from global_lb.inflight import InflightLedger
from global_lb.keeper import build_view
from global_lb.plugins import global_registry
from global_lb.plugins.affinity import RegionMemory
from global_lb.profiles import DEFAULT_REQUEST_PROFILE, build, profile_spec
from global_lb.router import GlobalRouter
from gtm.models import Priority, RegionSummary, RouteRequest, construct_every_field
from gtm.state.snapshot import FleetSnapshot
from policies import Verdict
from regional_lb import profiles as regional_profiles
from regional_lb.fairqueue import FairQueue, RefusalReason
from regional_lb.plugins.prefix import ZoneMemory
from regional_lb.router import Inputs, RegionalDecision, RegionalRouter, Route
from regional_lb.summary import build_summary as region_summary
from regional_lb.view import ViewBuilder as RegionalViewBuilder
from regional_lb.view import ViewSettings as RegionalViewSettings
from regional_lb.view import ZoneAccounting, ZoneState, zone_candidates
from zone_agent.affinity import sticky_gpu
from zone_agent.summary import build_summary as zone_summary

if TYPE_CHECKING:
    from fleetsim.simulator import Simulator
    from zone_agent.router import ZoneDecision


@dataclass(slots=True)
class Waiting:
    """A request in a region's fair queue."""

    index: int
    extra_ms: float
    request: RouteRequest
    inputs: Inputs
    decision: RegionalDecision | None = None


class Tiers(Routing):
    """gtm: global router → regional router → zone agent, one pool per zone."""

    ZONE_POOLS: ClassVar[bool] = True
    GLOBAL_TIER: ClassVar[bool] = True

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        policy = sim.policy
        spec = profile_spec(policy, "global-default", DEFAULT_REQUEST_PROFILE)
        self.global_router = GlobalRouter(build(global_registry(), spec, None), spec)
        # What the global tier sent each region since its last summary (as the front door).
        self.ledger = InflightLedger(sim.ledger_settings)
        zone_urls = MappingProxyType({z: f"http://{z}.sim" for z in sim.pools})
        self.regional_views = {
            r: RegionalViewBuilder(
                r, rtt=sim.rtt, settings=RegionalViewSettings(zone_urls=zone_urls)
            )
            for r in sim.region_ids
        }
        rspec = regional_profiles.profile_spec(policy)
        self.routers = {
            r: RegionalRouter(
                regional_profiles.build(rspec),
                saturation_filter=regional_profiles.SATURATION,
            )
            for r in sim.region_ids
        }
        #: Whether each regional decision builds its full trace record (the reference
        #: path, to compare: ``Simulator(regional_fast_path=False)``); the same choices.
        self.trace = not sim.regional_fast_path
        self.zacc = {r: ZoneAccounting() for r in sim.region_ids}
        for pool in sim.pools.values():
            # The regional LB's accounting of the zone: charged at dispatch, released at
            # the end (Simulator.dispatch / release).
            pool.regional = self.zacc[pool.region]
        self.queues: dict[str, FairQueue[Waiting]] = {r: FairQueue() for r in sim.region_ids}
        #: Where each tier sent prompts' prefixes (gtm.routing.placement): the front
        #: door's regions, remembered when it forwards (so worker 0 of a partitioned
        #: run keeps it, with the global choices), and each regional LB's zones,
        #: remembered when it dispatches.
        self.affinity = sim.spec.affinity
        self.regions_sent = RegionMemory()
        self.zones_sent = {r: ZoneMemory() for r in sim.region_ids}
        self.region_summaries: dict[str, RegionSummary] = {}
        self._revision = 0
        self._publish(0.0)

    @property
    def partitionable(self) -> bool:
        # Without a network a spill lands at once: no lookahead between processes.
        return self.sim.network

    def zone_choice(self, decision: ZoneDecision) -> ZoneDecision:
        # The zone agent keeps a conversation on the GPU its prefix was just sent to.
        return sticky_gpu(decision) if self.affinity else decision

    # ------------------------------------------------------------------ summaries

    def publish(self, now: float) -> None:
        t0 = perf_counter_ns()
        self._publish(now)
        self.sim.tier_ns["publish"] += perf_counter_ns() - t0

    def _publish(self, now: float) -> None:
        """Publish zone summaries, rebuild regional views and region summaries, then
        the global view — what the live publishers do every second."""
        sim = self.sim
        self._revision += 1
        owned = [r for r in sim.region_ids if r in sim.owned]
        zs = {
            p.zone_id: zone_summary(p.view, now)
            for p in sim.pools.values()
            if p.region in sim.owned
        }
        snap = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(sim.regions),
            zone_summaries=MappingProxyType(zs),
            region_summaries=MappingProxyType(dict(self.region_summaries)),
        )
        self.rviews = {}
        summaries = {}
        for r in owned:
            view = self.regional_views[r].build(snap, sim.policy, now_wall=now)
            self.zacc[r].observe(view.zones)
            self.rviews[r] = view
            summaries[r] = region_summary(
                view, self.zacc[r], published_at=now, endpoints=sim.regions[r].endpoints
            )
        if sim.link is not None:
            # The other processes' regions' summaries (a partitioned run), in order.
            summaries = sim.link.share(summaries)
        self.region_summaries = summaries
        snap2 = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(sim.regions),
            region_summaries=MappingProxyType(summaries),
        )
        health = HealthTable(self._revision, MappingProxyType({}), False)
        # As gtm up runs the global tier: a region without a summary is down.
        self.gview = build_view(
            sim.policy,
            snap2,
            health,
            topology=tuple(sim.regions.values()),
            require_summaries=True,
        )
        # Peers' views need the fresh region summaries too (spill decisions).
        snap3 = FleetSnapshot(
            revision=self._revision,
            regions=MappingProxyType(sim.regions),
            zone_summaries=MappingProxyType(zs),
            region_summaries=MappingProxyType(summaries),
        )
        for r in owned:
            self.rviews[r] = self.regional_views[r].build(snap3, sim.policy, now_wall=now)

    # ------------------------------------------------------------------ arrivals

    def arrive(self, i: int, now: float, verdict: Verdict) -> None:
        rr = self.route_request(i)
        region = self.decide_region(i, rr, now, verdict)
        if region is not None and region in self.sim.owned:
            self.enter_region(i, rr, region, now, verdict)

    def decide_region(self, i: int, rr: RouteRequest, now: float, verdict: Verdict) -> str | None:
        """The global tier's choice for request ``i`` (``None``: refused and ended)."""
        sim = self.sim
        if verdict.refused:
            sim.end(i, Status.REFUSED, "residency")
            return None
        t0 = perf_counter_ns()
        view = self.ledger.view(self.gview, now)
        outcome = self.global_router.decide(rr, view, verdict=verdict)
        sim.tier_ns["global"] += perf_counter_ns() - t0
        if outcome.region is None:
            sim.end(i, Status.REFUSED, f"global: {outcome.refusal}")
            return None
        region: str | None = outcome.region
        if self.affinity:
            # Back where the prompt's prefix was just sent, while that region may take it.
            region = self.regions_sent.place(
                region,
                rr,
                view,
                verdict.allowed,
                point=rr.client.location,
                country=rr.client.country,
                tokens_per_block=float(sim.requests[i].block_tokens),
                now=now,
            )
        assert region is not None
        # Charged as the front door charges a forward: before the region's own checks.
        # (Its quota refusal would come back a round trip later and take the charge
        # back; here the charge stays until the region's next summary, at most a tick.
        # Global decisions so depend on nothing a region decides, which is what lets
        # the regions of one run be simulated in parallel: fleetsim.partition.)
        self.ledger.charge(region, sim.model, rr.input_tokens, now)
        return region

    def enter_region(
        self, i: int, rr: RouteRequest | None, region: str, now: float, verdict: Verdict
    ) -> None:
        """Request ``i`` reaches ``region``'s regional LB: quota, then its decision."""
        sim = self.sim
        if not sim.admit(i, region, now):
            return
        req = sim.requests[i]
        inputs = Inputs(
            allowed=verdict.allowed,
            on_saturation=verdict.on_saturation,
            client_country_known=True,
            tokens_per_block=float(req.block_tokens),
        )
        if rr is None:
            rr = self.route_request(i)
        self._regional(i, rr, region, inputs, now, sim.clients.client_rtt(req, region))

    def route_request(self, i: int) -> RouteRequest:
        sim = self.sim
        req = sim.requests[i]
        return construct_every_field(
            RouteRequest,
            {
                "request_id": str(i),
                "model": sim.model,
                "input_tokens": req.input_tokens,
                "max_output_tokens": req.output_tokens,
                "tenant": req.tenant,
                "client": sim.clients.info(req),
                "data_class": "default",
                "priority": sim.bands.get(req.tenant, Priority.INTERACTIVE),
                "prefix_hashes": req.prefix_hashes,
            },
        )

    def on_hop(self, hop: Hop) -> None:
        """A spilled request reaches the peer region, which decides again."""
        sim = self.sim
        i = hop.index
        req = sim.requests[i]
        sim.spilled[i] = (hop.back_ms, hop.spilled_from[0])
        verdict = sim.clients.verdict(req.tenant, req.country)
        inputs = Inputs(
            allowed=verdict.allowed,
            on_saturation=verdict.on_saturation,
            hops=hop.hops,
            spilled_from=hop.spilled_from,
            client_country_known=True,
            tokens_per_block=float(req.block_tokens),
        )
        self._regional(i, self.route_request(i), hop.region, inputs, hop.at, hop.extra_ms)

    def _regional(
        self, i: int, rr: RouteRequest, region: str, inputs: Inputs, now: float, extra: float
    ) -> None:
        sim = self.sim
        t0 = perf_counter_ns()
        decision = self.routers[region].decide(
            rr,
            self.rviews[region],
            inputs,
            accounting=self.zacc[region],
            now=now,
            now_wall=now,
            trace=self.trace,
            keeper=self.zones_sent[region] if self.affinity else None,
        )
        sim.tier_ns["regional"] += perf_counter_ns() - t0
        if decision.route is Route.LOCAL and decision.zone is not None:
            self._dispatch_local(i, rr, region, inputs, decision.zone, now, extra)
        elif decision.route is Route.SPILL and decision.peer is not None:
            sim.spills += 1
            # The request travels to the peer (half the round trip) and is decided
            # again there; the answer's way back is added to its latency.
            one_way_ms = decision.peer.rtt_ms / 2.0 if sim.network else 0.0
            # The way back so far; the peer keeps it from here (it is where the
            # request ends, or spills again).
            back_ms = sim.spilled.pop(i, (0.0, ""))[0]
            sim.send(
                Hop(
                    now + one_way_ms / 1000.0,
                    i,
                    decision.peer.region,
                    inputs.hops + 1,
                    (*inputs.spilled_from, region),
                    extra + one_way_ms,
                    back_ms + one_way_ms,
                )
            )
        elif decision.route is Route.QUEUE:
            req = sim.requests[i]
            offered = self.queues[region].offer(
                req.tenant,
                rr.priority,
                Waiting(i, extra, rr, inputs),
                input_tokens=req.input_tokens,
                output_tokens=req.output_tokens,
                now=now,
            )
            if isinstance(offered, RefusalReason):
                sim.end_unserved(i, Status.REFUSED, f"regional queue: {offered.value}")
            else:
                self._drain_queue(region, now)
        else:
            sim.end_unserved(i, Status.REFUSED, f"regional: {decision.reason}")

    # ------------------------------------------------------------------ fair queues

    def place_waiting(self, region: str, now: float) -> None:
        if len(self.queues[region]):
            self._drain_queue(region, now)

    def waiting(self) -> bool:
        return any(len(q) for q in self.queues.values())

    def end_waiting(self) -> None:
        for queue in self.queues.values():
            while (item := queue.pop()) is not None:
                self.sim.end_unserved(item.payload.index, Status.TIMED_OUT, "queued at the horizon")

    def _drain_queue(self, region: str, now: float) -> None:
        """Expire, then hand queued requests to zones with room (regional_lb.dispatch)."""
        sim = self.sim
        queue = self.queues[region]
        for expired in queue.expire(now):
            sim.end_unserved(expired.payload.index, Status.TIMED_OUT, "regional queue ttl")
        gave_up = [
            item
            for item in queue.items()
            if sim.requests[item.payload.index].at_s + sim.client_timeout_s <= now
        ]
        for item in gave_up:
            # The client went away while waiting (regional_lb.dispatch removes it too).
            queue.remove(item)
            sim.end_unserved(item.payload.index, Status.TIMED_OUT, sim.timeout_reason)
        if not len(queue):
            return
        router, view, acc = self.routers[region], self.rviews[region], self.zacc[region]
        full = False

        def placeable(waiting: Waiting) -> bool:
            nonlocal full
            if full:
                return False
            waiting.decision = router.place(
                waiting.request, view, waiting.inputs, accounting=acc, trace=self.trace
            )
            full = waiting.decision is None or waiting.decision.zone is None
            return not full

        while (popped := queue.pop(placeable)) is not None:
            waiting = popped.payload
            zone = waiting.decision.zone if waiting.decision is not None else None
            assert zone is not None
            self._dispatch_local(
                waiting.index,
                waiting.request,
                region,
                waiting.inputs,
                zone,
                now,
                waiting.extra_ms,
            )

    def _dispatch_local(
        self,
        i: int,
        rr: RouteRequest,
        region: str,
        inputs: Inputs,
        chosen: ZoneState,
        now: float,
        extra: float,
    ) -> None:
        """The regional LB hands request ``i`` to a zone: back to the zone its prefix
        was just sent to while that zone can take it, else the profile's ``chosen``."""
        zone = chosen
        if self.affinity:
            zone = self.zones_sent[region].place(
                chosen,
                rr,
                lambda: zone_candidates(self.rviews[region], rr.model, self.zacc[region]),
                tokens_per_block=inputs.tokens_per_block,
                now=now,
            )
        self.sim.dispatch(i, self.sim.pools[zone.id], now, extra)

    # ------------------------------------------------------------------ partitioned runs

    def probe(self, until: float) -> dict[str, int]:
        sim = self.sim
        index = {r: k for k, r in enumerate(sim.region_ids)}
        feeds = self.decide_until(until, False, len(sim.region_ids), index)
        return {region: len(feed) for region, feed in zip(sim.region_ids, feeds, strict=True)}

    def enter_fed(self, at: float, i: int, region: str) -> None:
        sim = self.sim
        req = sim.requests[i]
        sim.out.home[i] = sim.clients.home_of(req)
        self.enter_region(i, None, region, at, sim.clients.verdict(req.tenant, req.country))

    def decide_until(
        self, barrier: float, inclusive: bool, workers: int, worker_of: Mapping[str, int]
    ) -> list[list[tuple[float, int, str]]]:
        sim = self.sim
        feeds: list[list[tuple[float, int, str]]] = [[] for _ in range(workers)]
        requests, home = sim.requests, sim.out.home
        i, n = sim.next_arrival, len(requests)
        while i < n:
            req = requests[i]
            at = req.at_s
            if at > barrier or (at == barrier and not inclusive):
                break
            # The nearest region to the client: what "cross-region" is measured from.
            home[i] = sim.clients.home_of(req)
            verdict = sim.clients.verdict(req.tenant, req.country)
            region = self.decide_region(i, self.route_request(i), at, verdict)
            if region is not None:
                feeds[worker_of[region]].append((at, i, region))
            i += 1
        sim.next_arrival = i
        return feeds

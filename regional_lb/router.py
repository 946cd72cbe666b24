"""The regional decision for one admitted request (sans-io): a zone, a peer, the queue,
or a refusal.

::

    residency excludes this region ─────────────────────────────▶ REFUSE (451)
    split: the request's draw falls in the peers' share ────────▶ SPILL (degraded)
    zone profile (filters → scores → pick) finds a zone ────────▶ LOCAL
    every zone saturated / none healthy, an allowed peer fits ──▶ SPILL (saturated)
    every zone saturated ───────────────────────────────────────▶ QUEUE (fair queue)
    nothing serves the model here or in an allowed peer ────────▶ REFUSE (404)
    zones serve it but none is healthy ─────────────────────────▶ REFUSE (503)

Spilling happens only to peers inside the request's residency-allowed set
(:mod:`regional_lb.spill`), never when the residency verdict says
``on_saturation: reject``, and — unless configured otherwise — never when admission
says it cannot (``Inputs.client_country_known`` false: the replica has no tiers' key,
so a peer could not believe the hop count; :mod:`regional_lb.admission`). Admission
locates every client itself or believes a signed upstream (:mod:`regional_lb.location`),
so the verdict is as narrow as the front door's. Each spill is counted against
:class:`~regional_lb.spill.SpillLimiter`; when it says no, the request is served (or
queued) locally.

Zones are chosen by the regional profile on :class:`gtm.routing.Runner` (filters →
scores → pick over a :class:`~regional_lb.view.ZoneBatch`); the decision record and its
trace are built only when read (:attr:`RegionalDecision.decision`). Given a
:class:`gtm.routing.ProfileSource`, the router follows the policy of the view it
decides over: a new policy generation rebuilds the profile (hot reload).

The split (:mod:`regional_lb.priority`) is capacity-aware by default: the peers' share
is the part of the demand admitted here (:class:`~regional_lb.priority.DemandMeter`,
fed by every decision) that the zones' measured headroom cannot take. Envoy's
health-count overprovisioning is ``SplitMode.ENVOY``. The draw between region and peers
uses :func:`gtm.routing.request_rng` on the request id, so the same request over the
same view and demand always gets the same answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from gtm.errors import NoEligibleCandidate
from gtm.models import Decision, DecisionTrace, RouteRequest
from gtm.routing import Outcome, ProfileSource, request_rng
from policies.documents import SaturationPolicy
from regional_lb.priority import (
    OVERPROVISIONING_FACTOR,
    PANIC_THRESHOLD,
    CapacitySettings,
    DemandMeter,
    PrioritySplit,
    SplitMode,
    capacity_split,
    split,
    zone_headroom,
)
from regional_lb.profiles import ZoneProfile
from regional_lb.spill import PeerOption, SpillLimiter, SpillSettings, spill_options
from regional_lb.view import (
    RegionalView,
    ZoneAccounting,
    ZoneBatch,
    ZoneContext,
    ZoneState,
    capacity_health,
    zone_candidates,
)


class Route(StrEnum):
    LOCAL = "local"
    SPILL = "spill"
    QUEUE = "queue"
    REFUSE = "refuse"


class Reason(StrEnum):
    """Why a request went where it went (metric labels and logs)."""

    CHOSEN = "chosen"
    DEGRADED = "degraded"  # the split sent it to a peer (excess demand, or Envoy's)
    DRAINED = "region-drained"
    SATURATED = "saturated"
    UNAVAILABLE = "no-healthy-zone"
    RESIDENCY = "residency"
    MODEL_NOT_FOUND = "model-not-found"


class PanicMode(StrEnum):
    """Envoy's two panic behaviours (envoyproxy.io, "Panic threshold")."""

    ALL = "all"  # balance over every zone, whatever its health (Envoy's default)
    NONE = "none"  # fail the traffic instead (Envoy's ``fail_traffic_on_panic``)


@dataclass(frozen=True, slots=True)
class RouterSettings:
    #: How the proactive region/peers split is computed (capacity-aware by default).
    split_mode: SplitMode = SplitMode.CAPACITY
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    overprovisioning_factor: float = OVERPROVISIONING_FACTOR
    panic_threshold: float = PANIC_THRESHOLD
    panic_mode: PanicMode = PanicMode.ALL
    spill: SpillSettings = field(default_factory=SpillSettings)
    #: Refuse to spill requests admission marks unsafe to spill (fail closed).
    spill_requires_client_country: bool = True
    #: Seed of the per-request draw between region and peers.
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Inputs:
    """What one decision depends on besides the request and the view."""

    allowed: frozenset[str]
    on_saturation: SaturationPolicy
    hops: int = 0
    spilled_from: tuple[str, ...] = ()
    client_country_known: bool = False
    tokens_per_block: float = 0.0


@dataclass(frozen=True, slots=True)
class RegionalDecision:
    route: Route
    reason: Reason
    zone: ZoneState | None = None
    #: The zone profile's outcome (None for a spill, the queue, a refusal, or without a
    #: trace); :attr:`decision` is built from it when read.
    outcome: Outcome[ZoneBatch] | None = None
    peer: PeerOption | None = None
    #: Further peers to try (in order) if the chosen one fails before the first byte.
    fallbacks: tuple[PeerOption, ...] = ()
    split: PrioritySplit | None = None
    #: The zone profile's refusal when it found no zone (with ``trace``): its partial
    #: trace is built when read (:attr:`trace`).
    refusal: NoEligibleCandidate | None = field(default=None, compare=False)

    @property
    def trace(self) -> DecisionTrace | None:
        """The zone profile's partial trace when it found no zone."""
        return None if self.refusal is None else self.refusal.trace

    @property
    def decision(self) -> Decision | None:
        """The zone choice's decision record with its trace (built on each read)."""
        return None if self.outcome is None else self.outcome.to_decision()


class LocalKeeper(Protocol):
    """Keeps a request the capacity split drew for a peer when its prefix is cached here
    (:meth:`regional_lb.plugins.prefix.ZoneMemory.keep_local`), or one no zone can take
    now on the zone holding its prefix when that zone can hold it
    (:meth:`~regional_lb.plugins.prefix.ZoneMemory.hold`): the zone that keeps it, or
    ``None``."""

    def keep_local(
        self,
        request: RouteRequest,
        local: Callable[[], ZoneState | None],
        zones: Callable[[], tuple[ZoneState, ...]],
        *,
        tokens_per_block: float,
        now: float,
    ) -> ZoneState | None: ...

    def hold(
        self, request: RouteRequest, zones: tuple[ZoneState, ...], *, now: float
    ) -> ZoneState | None: ...


class RegionalRouter:
    """Zone choice + spillover for one region. ``decide`` is synchronous and does no I/O;
    its state is the spill rate limiter and the admitted-demand meter (pass the same
    ones to the router that replaces this one when the policy changes)."""

    def __init__(
        self,
        profile: ZoneProfile | ProfileSource[ZoneProfile],
        *,
        saturation_filter: str | None = None,
        settings: RouterSettings | None = None,
        limiter: SpillLimiter | None = None,
        demand: DemandMeter | None = None,
    ) -> None:
        """``profile``: a built profile, or a source that follows the view's policy.
        ``saturation_filter``: the filter whose refusal means "every zone is full"
        (default: the profile's last filter, where :mod:`regional_lb.profiles` puts it)."""
        self._source = profile if isinstance(profile, ProfileSource) else None
        self._profile = profile.current if isinstance(profile, ProfileSource) else profile
        self._saturation = saturation_filter
        self._settings = settings or RouterSettings()
        self._limiter = limiter or SpillLimiter(self._settings.spill)
        self._demand = demand or DemandMeter(self._settings.capacity.demand_decay_s)

    @property
    def settings(self) -> RouterSettings:
        return self._settings

    @property
    def profile(self) -> ZoneProfile:
        return self._profile

    def _profile_for(self, view: RegionalView) -> ZoneProfile:
        if self._source is not None:
            self._profile = self._source.update(view.policy)
        return self._profile

    def _choose(
        self, request: RouteRequest, zones: tuple[ZoneState, ...], ctx: ZoneContext
    ) -> Outcome[ZoneBatch]:
        return self._profile_for(ctx.view).decide(ZoneBatch(request, zones, ctx))

    @property
    def demand(self) -> DemandMeter:
        return self._demand

    def decide(
        self,
        request: RouteRequest,
        view: RegionalView,
        inputs: Inputs,
        *,
        accounting: ZoneAccounting | None,
        now: float,
        now_wall: float,
        trace: bool = True,
        keeper: LocalKeeper | None = None,
    ) -> RegionalDecision:
        """The request's route. ``keeper`` (placement memory, when affinity is on) may
        keep a request the capacity split drew for a peer, or one no zone can take now,
        on the zone holding its prefix: asked before a spill token is taken, so a kept
        request spends none (the zone summaries' clock, ``now_wall``, is its clock)."""
        if view.region not in inputs.allowed:
            return RegionalDecision(Route.REFUSE, Reason.RESIDENCY)
        # Demand is what was admitted here, wherever it ends up (see the priority module).
        self._demand.add(request.model, request.input_tokens, now)
        zones = zone_candidates(view, request.model, accounting)
        options = self._options(request, view, inputs, now_wall)
        priority = self._split(zones, options, request, view, now)
        if options and (view.region_drained or self._spills(request, priority.local_load)):
            reason = Reason.DRAINED if view.region_drained else Reason.DEGRADED
            if keeper is not None and reason is Reason.DEGRADED:
                # A drained region keeps nothing; nor does one none of whose zones
                # can take the request now (the split's draw stands).
                stays = keeper.keep_local(
                    request,
                    lambda: self._local(request, zones, view, inputs),
                    lambda: zones,
                    tokens_per_block=inputs.tokens_per_block,
                    now=now_wall,
                )
                if stays is not None:
                    return RegionalDecision(Route.LOCAL, Reason.CHOSEN, stays)
            spilled = self._spill(options, reason, priority, now)
            if spilled is not None:
                return spilled
        panic = priority.local_panic and self._settings.panic_mode is PanicMode.ALL
        ctx = ZoneContext(view, inputs.allowed, panic, inputs.tokens_per_block)
        try:
            outcome = self._choose(request, zones, ctx)
        except NoEligibleCandidate as exc:
            if keeper is not None and not view.region_drained and self._saturated(exc):
                # Every zone is full: the one holding the prompt's prefix keeps it when
                # only its KV cache use fills it (regional_lb.plugins.prefix.can_hold).
                held = keeper.hold(request, zones, now=now_wall)
                if held is not None:
                    return RegionalDecision(Route.LOCAL, Reason.CHOSEN, held)
            refusal = exc if trace else None
            return self._no_zone(exc, refusal, zones, options, priority, view, request, inputs, now)
        zone = zones[outcome.choice]
        kept = outcome if trace else None
        return RegionalDecision(Route.LOCAL, Reason.CHOSEN, zone, kept, split=priority)

    def place(
        self,
        request: RouteRequest,
        view: RegionalView,
        inputs: Inputs,
        *,
        accounting: ZoneAccounting | None,
        excluded: frozenset[str] = frozenset(),
        trace: bool = True,
    ) -> RegionalDecision | None:
        """A zone for a request leaving the fair queue or being retried (``excluded``:
        zones it failed on), or ``None`` if no zone can take it now."""
        zones = zone_candidates(view, request.model, accounting)
        ctx = ZoneContext(view, inputs.allowed, False, inputs.tokens_per_block, excluded)
        try:
            outcome = self._choose(request, zones, ctx)
        except NoEligibleCandidate:
            return None
        kept = outcome if trace else None
        return RegionalDecision(Route.LOCAL, Reason.CHOSEN, zones[outcome.choice], kept)

    # ------------------------------------------------------------------ parts

    def _local(
        self,
        request: RouteRequest,
        zones: tuple[ZoneState, ...],
        view: RegionalView,
        inputs: Inputs,
    ) -> ZoneState | None:
        """The zone :meth:`place` would choose, from candidates already built."""
        ctx = ZoneContext(view, inputs.allowed, False, inputs.tokens_per_block)
        try:
            return zones[self._choose(request, zones, ctx).choice]
        except NoEligibleCandidate:
            return None

    def _options(
        self, request: RouteRequest, view: RegionalView, inputs: Inputs, now_wall: float
    ) -> tuple[PeerOption, ...]:
        settings = self._settings
        if inputs.on_saturation is not SaturationPolicy.SPILL_WITHIN_ALLOWED:
            return ()
        if settings.spill_requires_client_country and not inputs.client_country_known:
            return ()
        return spill_options(
            view,
            request,
            allowed=inputs.allowed,
            spilled_from=inputs.spilled_from,
            hops=inputs.hops,
            now_wall=now_wall,
            settings=settings.spill,
        )

    def _split(
        self,
        zones: tuple[ZoneState, ...],
        options: tuple[PeerOption, ...],
        request: RouteRequest,
        view: RegionalView,
        now: float,
    ) -> PrioritySplit:
        settings = self._settings
        healthy = total = 0
        elsewhere = 0.0
        peers = self._peer_capacity(view, request.model)
        for option in options:
            found = peers.get(option.region)
            if found is not None:
                healthy += found[0]
                total += found[1]
                elsewhere += found[2]
        local = capacity_health(zones, request.model)
        if settings.split_mode is SplitMode.ENVOY:
            return split(
                local,
                (healthy, total),
                factor=settings.overprovisioning_factor,
                panic_threshold=settings.panic_threshold,
            )
        return capacity_split(
            self._headroom(zones),
            self._demand.tokens_per_s(request.model, now),
            local,
            (healthy, total),
            peer_headroom_tokens_per_s=elsewhere,
            panic_threshold=settings.panic_threshold,
        )

    def _peer_capacity(self, view: RegionalView, model: str) -> dict[str, tuple[int, int, float]]:
        """Each peer's (healthy GPUs, GPUs, headroom) for ``model``, from its summary:
        once per view (peers change only with their summaries)."""
        capacity = self._settings.capacity
        memo = view.memo.peer_capacity
        found = memo.get((model, capacity))
        if found is None:
            found = memo[(model, capacity)] = {}
            for region, peer in view.peers.items():
                load = peer.summary.load_for(model) if peer.summary is not None else None
                if load is not None:
                    found[region] = (
                        load.healthy_gpus,
                        load.gpus,
                        zone_headroom(
                            load.prefill_tokens_per_s,
                            load.queued_prefill_tokens,
                            target_utilisation=capacity.target_utilisation,
                            backlog_horizon_s=capacity.backlog_horizon_s,
                        ),
                    )
        return found

    def _headroom(self, zones: tuple[ZoneState, ...]) -> float:
        """Prompt tokens/s the region's zones can take on now (see the priority module):
        none from a zone the health filter would not pass (drained, unhealthy, dark, no
        agent URL). A zone's concurrency and KV limits are not rates: the saturation
        filter applies them per request, and a request no zone can take then spills as
        ``saturated`` (or queues)."""
        capacity = self._settings.capacity
        free = 0.0
        for zone in zones:
            load = zone.load
            if load is None or zone.drained or not zone.healthy or zone.info.url is None:
                continue
            free += zone_headroom(
                load.prefill_tokens_per_s,
                zone.queued_tokens,
                target_utilisation=capacity.target_utilisation,
                backlog_horizon_s=capacity.backlog_horizon_s,
            )
        return free

    def _spills(self, request: RouteRequest, local_load: float) -> bool:
        """Whether the request's draw lands past the local share. A draw is below 1, so
        with the whole load local there is none to make (and no random source to seed)."""
        return local_load < 1.0 and self._draw(request) >= local_load

    def _draw(self, request: RouteRequest) -> float:
        return request_rng(request, self._settings.seed).random()

    def _spill(
        self,
        options: tuple[PeerOption, ...],
        reason: Reason,
        priority: PrioritySplit | None,
        now: float,
    ) -> RegionalDecision | None:
        for index, option in enumerate(options):
            if self._limiter.allow(option.region, now):
                return RegionalDecision(
                    Route.SPILL,
                    reason,
                    peer=option,
                    fallbacks=options[index + 1 :],
                    split=priority,
                )
        return None

    def _saturated(self, exc: NoEligibleCandidate) -> bool:
        """Whether ``exc`` is the saturation filter's: every zone is full."""
        saturation = self._saturation
        if saturation is None:
            filters = self._profile.filters
            saturation = filters[-1].name if filters else None
        return exc.filter_name == saturation

    def _no_zone(
        self,
        exc: NoEligibleCandidate,
        refusal: NoEligibleCandidate | None,
        zones: tuple[ZoneState, ...],
        options: tuple[PeerOption, ...],
        priority: PrioritySplit,
        view: RegionalView,
        request: RouteRequest,
        inputs: Inputs,
        now: float,
    ) -> RegionalDecision:
        saturated = self._saturated(exc)
        reason = Reason.SATURATED if saturated else Reason.UNAVAILABLE
        if options:
            spilled = self._spill(options, reason, priority, now)
            if spilled is not None:
                return RegionalDecision(
                    spilled.route,
                    spilled.reason,
                    peer=spilled.peer,
                    fallbacks=spilled.fallbacks,
                    split=priority,
                    refusal=refusal,
                )
        if saturated:
            return RegionalDecision(Route.QUEUE, reason, split=priority, refusal=refusal)
        served = any(z.serves_model for z in zones) or any(
            (p.summary is not None and p.summary.load_for(request.model) is not None)
            for p in view.peers.values()
            if p.id in inputs.allowed
        )
        why = reason if served else Reason.MODEL_NOT_FOUND
        return RegionalDecision(Route.REFUSE, why, split=priority, refusal=refusal)

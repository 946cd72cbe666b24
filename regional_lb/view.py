"""The regional tier's view of its zones and peers, and the per-decision candidates.

A :class:`RegionalView` is built from the fleet snapshot and the policy in force each
time either changes (never mutated; swapped in with one reference assignment). It
holds every zone of this region — with its summary, drain state, endpoint and RTT — and
every peer region with its summary, endpoint and inter-region RTT.

Zones whose summary vanished (a dead zone agent's lease expired) stay in the view as
*dark* zones for :attr:`ViewSettings.dark_zone_memory_s`, with their last known size
and no healthy GPU: Envoy-style overprovisioning compares healthy with *total*
capacity, and a zone that disappears must count as lost capacity, not as no capacity.

Per decision, :func:`zone_candidates` turns the view into :class:`ZoneState`
candidates for the request's model, corrected by :class:`ZoneAccounting`: the requests
this replica sent to a zone since its last summary are not in that summary yet (the
summaries lag by up to a publish interval), so they are added to its load — llm-d's
router-local in-flight accounting in spirit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gtm.models import DrainTarget, ModelLoad, RegionSummary, RouteRequest, ZoneSummary
from gtm.policy_store import ActivePolicy
from gtm.routing import Batch
from gtm.state.snapshot import FleetSnapshot
from regional_lb.rtt import INTRA_REGION_RTT_MS, LOCAL_ZONE_RTT_MS, RegionRtt

#: llm-d's saturation detector defaults (flowcontrol/saturationdetector/utilization):
#: an endpoint with 5 or more queued requests, or KV-cache use of 80 % or more, is
#: saturated. We apply them per GPU of a zone: a zone is full when its running and
#: waiting requests reach its running capacity plus 5 waiting per healthy GPU.
QUEUE_DEPTH_PER_GPU = 5
KV_CACHE_UTIL_THRESHOLD = 0.8


@dataclass(frozen=True, slots=True)
class ViewSettings:
    queue_depth_per_gpu: int = QUEUE_DEPTH_PER_GPU
    kv_cache_util_threshold: float = KV_CACHE_UTIL_THRESHOLD
    #: How long a zone whose summary vanished counts as lost capacity, s.
    dark_zone_memory_s: float = 300.0
    #: The zone this replica runs in (its RTT is :data:`LOCAL_ZONE_RTT_MS`), if known.
    local_zone: str | None = None
    #: Zone agent URLs configured statically (``--zone-url``); a ``Zone`` record's
    #: endpoint in the store takes precedence.
    zone_urls: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class ZoneInfo:
    """One zone of the region in the view (model-independent)."""

    id: str
    summary: ZoneSummary | None
    drained: bool
    url: str | None
    rtt_ms: float
    #: The zone's hot prefix blocks (its summary's sketch), for locality.
    sketch: frozenset[int] = frozenset()
    #: A dark zone's last summary (its size counts as lost capacity).
    last_summary: ZoneSummary | None = None


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """Another region, as a spillover target."""

    id: str
    summary: RegionSummary | None
    drained: bool
    url: str | None
    rtt_ms: float


@dataclass(frozen=True, slots=True)
class ZoneStatic:
    """The request-independent part of one zone's candidate state for one model
    (:func:`zone_candidates` adds what the accounting says was sent since)."""

    info: ZoneInfo
    load: ModelLoad | None
    #: Saturated whatever was sent since (no summary for the model, no GPU, full KV).
    full: bool
    full_in_panic: bool
    #: Running + waiting requests of the summary, and the busy count at which the zone
    #: is full (healthy GPUs / every GPU): see :func:`is_saturated`.
    busy: int
    limit: int
    limit_in_panic: int
    #: ``full`` for its KV cache use alone (it has healthy GPUs and running room).
    kv_only: bool = False


@dataclass(frozen=True, slots=True)
class PeerStatic:
    """The request-independent part of one peer as a spill target for one model: the
    peer passed every check of :func:`regional_lb.spill.why_not` that does not depend on
    the request's residency, path or the clock."""

    info: PeerInfo
    summary: RegionSummary
    url: str
    healthy_gpus: int
    prefill_tokens_per_s: float
    queueing_ms: float


class ViewMemo:
    """What decisions derive from one view alone, computed on first use (a view is
    immutable, so it never goes stale; views change once per publish, decisions come
    hundreds of times a second)."""

    __slots__ = ("candidates", "peer_capacity", "peers")

    def __init__(self) -> None:
        self.candidates: dict[str, tuple[ZoneStatic, ...]] = {}
        #: Keyed by (model, the spill settings the checks used).
        self.peers: dict[tuple[str, object], tuple[PeerStatic, ...]] = {}
        #: Keyed by (model, the capacity settings): peer → (healthy GPUs, GPUs,
        #: headroom tokens/s) for the peers whose summary has the model (the router's
        #: priority split).
        self.peer_capacity: dict[tuple[str, object], dict[str, tuple[int, int, float]]] = {}


@dataclass(frozen=True, slots=True)
class RegionalView:
    """Everything zone choice and spillover read, at one revision. Immutable."""

    region: str
    snapshot_revision: int
    policy: ActivePolicy | None
    zones: Mapping[str, ZoneInfo]
    peers: Mapping[str, PeerInfo]
    region_drained: bool = False
    stale: bool = False
    settings: ViewSettings = field(default_factory=ViewSettings)
    #: Per-view derived data (not part of the view's value).
    memo: ViewMemo = field(default_factory=ViewMemo, init=False, repr=False, compare=False)

    @property
    def policy_generation(self) -> int:
        return 0 if self.policy is None else self.policy.generation


# ---------------------------------------------------------------------------- building


def _first_url(endpoints: tuple[object, ...]) -> str | None:
    for endpoint in endpoints:
        url = getattr(endpoint, "url", None)
        if isinstance(url, str) and url:
            return url.rstrip("/")
    return None


class ViewBuilder:
    """Builds views; remembers vanished zones (the only state kept between builds)."""

    def __init__(
        self, region: str, *, rtt: RegionRtt | None = None, settings: ViewSettings | None = None
    ) -> None:
        self._region = region
        self._rtt = rtt or RegionRtt()
        self._settings = settings or ViewSettings()
        self._last: dict[str, tuple[ZoneSummary, float]] = {}

    @property
    def region(self) -> str:
        return self._region

    def build(
        self,
        snapshot: FleetSnapshot,
        policy: ActivePolicy | None,
        *,
        now_wall: float,
        stale: bool = False,
    ) -> RegionalView:
        rtt = self._rtt.with_locations({r.id: r.location for r in snapshot.regions.values()})
        return RegionalView(
            region=self._region,
            snapshot_revision=snapshot.revision,
            policy=policy,
            zones=MappingProxyType(self._zones(snapshot, now_wall)),
            peers=MappingProxyType(self._peers(snapshot, policy, rtt)),
            region_drained=snapshot.is_drained(DrainTarget.REGION, self._region),
            stale=stale,
            settings=self._settings,
        )

    def _zones(self, snapshot: FleetSnapshot, now_wall: float) -> dict[str, ZoneInfo]:
        region = self._region
        summaries = {
            s.zone_id: s for s in snapshot.zone_summaries.values() if s.region_id == region
        }
        records = {z.id: z for z in snapshot.zones_by_region.get(region, ())}
        for zone_id, seen_summary in summaries.items():
            self._last[zone_id] = (seen_summary, now_wall)
        memory = self._settings.dark_zone_memory_s
        for zone_id, (_, seen) in list(self._last.items()):
            if zone_id not in summaries and now_wall - seen > memory:
                del self._last[zone_id]
        zones: dict[str, ZoneInfo] = {}
        for zone_id in sorted(set(summaries) | set(records) | set(self._last)):
            summary = summaries.get(zone_id)
            record = records.get(zone_id)
            remembered = self._last.get(zone_id)
            zones[zone_id] = ZoneInfo(
                id=zone_id,
                summary=summary,
                drained=snapshot.is_drained(DrainTarget.ZONE, zone_id),
                url=(
                    (_first_url(record.endpoints) if record is not None else None)
                    or self._settings.zone_urls.get(zone_id)
                ),
                rtt_ms=(
                    LOCAL_ZONE_RTT_MS
                    if zone_id == self._settings.local_zone
                    else INTRA_REGION_RTT_MS
                ),
                sketch=frozenset(summary.prefix_sketch) if summary is not None else frozenset(),
                last_summary=None if summary is not None or remembered is None else remembered[0],
            )
        return zones

    def _peers(
        self, snapshot: FleetSnapshot, policy: ActivePolicy | None, rtt: RegionRtt
    ) -> dict[str, PeerInfo]:
        ids = set(snapshot.regions) | {s.region_id for s in snapshot.region_summaries.values()}
        policy_regions = policy.policy_set.regions if policy is not None else {}
        ids |= set(policy_regions)
        ids.discard(self._region)
        peers: dict[str, PeerInfo] = {}
        for region_id in sorted(ids):
            summary = snapshot.region_summaries.get(region_id)
            record = snapshot.regions.get(region_id)
            url = _first_url(summary.endpoints) if summary is not None else None
            if url is None and record is not None:
                url = _first_url(record.endpoints)
            spec = policy_regions.get(region_id)
            if url is None and spec is not None:
                url = _first_url(spec.endpoints)
            peers[region_id] = PeerInfo(
                id=region_id,
                summary=summary,
                drained=snapshot.is_drained(DrainTarget.REGION, region_id),
                url=url,
                rtt_ms=rtt.between(self._region, region_id),
            )
        return peers


# ---------------------------------------------------------------------------- accounting


class ZoneAccounting:
    """Requests this replica has in flight per (zone, model), and how many of them the
    zone's last summary cannot know about yet. Mutated by the service between
    decisions (decisions are synchronous, so none sees a half-applied change)."""

    def __init__(self) -> None:
        self._in_flight: dict[tuple[str, str], list[int]] = {}  # [requests, prefill tokens]
        self._base: dict[tuple[str, str], tuple[int, int]] = {}
        self._seen: dict[str, float] = {}  # zone -> published_at of the summary we based on

    def start(self, zone: str, model: str, prefill_tokens: int) -> None:
        counts = self._in_flight.setdefault((zone, model), [0, 0])
        counts[0] += 1
        counts[1] += prefill_tokens

    def finish(self, zone: str, model: str, prefill_tokens: int) -> None:
        counts = self._in_flight.get((zone, model))
        if counts is None:
            return
        counts[0] = max(0, counts[0] - 1)
        counts[1] = max(0, counts[1] - prefill_tokens)

    def in_flight(self, zone: str, model: str) -> int:
        counts = self._in_flight.get((zone, model))
        return 0 if counts is None else counts[0]

    def total_in_flight(self) -> int:
        return sum(c[0] for c in self._in_flight.values())

    def observe(self, zones: Mapping[str, ZoneInfo]) -> None:
        """A new view: zones with a newer summary now account for what we had sent."""
        for zone_id, info in zones.items():
            if info.summary is None or self._seen.get(zone_id) == info.summary.published_at:
                continue
            self._seen[zone_id] = info.summary.published_at
            for (zone, model), counts in self._in_flight.items():
                if zone == zone_id:
                    self._base[(zone, model)] = (counts[0], counts[1])

    def unseen(self, zone: str, model: str) -> tuple[int, int]:
        """(requests, prefill tokens) sent to ``zone`` since its summary was published."""
        counts = self._in_flight.get((zone, model))
        if counts is None:
            return 0, 0
        base = self._base.get((zone, model), (0, 0))
        return max(0, counts[0] - base[0]), max(0, counts[1] - base[1])


# ---------------------------------------------------------------------------- candidates


@dataclass(frozen=True, slots=True)
class ZoneState:
    """One zone as a candidate for one request's model (``.id`` for the framework)."""

    id: str
    info: ZoneInfo
    load: ModelLoad | None
    #: Requests and prefill tokens we sent since the summary (added to its load).
    unseen_requests: int = 0
    unseen_tokens: int = 0
    saturated: bool = False
    #: Whether it would be full with every GPU healthy (what panic mode goes by).
    saturated_in_panic: bool = False
    #: Saturated by its KV cache use alone, its request count under its limit: a
    #: request whose prefix it holds adds only its uncached part to that use
    #: (:func:`regional_lb.plugins.prefix.can_hold`).
    kv_bound: bool = False

    @property
    def drained(self) -> bool:
        return self.info.drained

    @property
    def healthy(self) -> bool:
        summary = self.info.summary
        return (
            summary is not None
            and summary.healthy
            and self.load is not None
            and self.load.healthy_gpus > 0
            and self.load.prefill_tokens_per_s > 0.0
        )

    @property
    def serves_model(self) -> bool:
        return self.load is not None and self.load.gpus > 0

    @property
    def queued_tokens(self) -> int:
        return 0 if self.load is None else self.load.queued_prefill_tokens + self.unseen_tokens

    @property
    def running(self) -> int:
        if self.load is None:
            return 0
        return self.load.running_requests + self.load.waiting_requests + self.unseen_requests

    def utilisation(self) -> float:
        """Share of running capacity in use (queued requests count), in [0, 1]."""
        if self.load is None or self.load.max_running_requests == 0:
            return 1.0
        return min(1.0, self.running / self.load.max_running_requests)

    def kv_free_fraction(self) -> float:
        if self.load is None or self.load.kv_blocks_total == 0:
            return 1.0
        return self.load.kv_blocks_free / self.load.kv_blocks_total


def is_saturated(
    load: ModelLoad, unseen_requests: int, settings: ViewSettings, *, all_healthy: bool = False
) -> bool:
    """Full: running + waiting (+ unseen) reach capacity + a short queue per healthy
    GPU, or the KV cache is past the threshold (llm-d's detector, per zone).

    ``all_healthy`` counts every GPU as healthy (Envoy's panic mode ignores health)."""
    gpus = load.gpus if all_healthy else load.healthy_gpus
    if gpus == 0 or load.max_running_requests == 0:
        return True
    busy = load.running_requests + load.waiting_requests + unseen_requests
    if busy >= load.max_running_requests + settings.queue_depth_per_gpu * gpus:
        return True
    if load.kv_blocks_total > 0:
        used = 1.0 - load.kv_blocks_free / load.kv_blocks_total
        return used >= settings.kv_cache_util_threshold
    return False


def zone_candidates(
    view: RegionalView, model: str, accounting: ZoneAccounting | None = None
) -> tuple[ZoneState, ...]:
    """Every zone of the region as a candidate for ``model``, in id order."""
    statics = view.memo.candidates.get(model)
    if statics is None:
        statics = view.memo.candidates[model] = _zone_statics(view, model)
    out: list[ZoneState] = []
    for z in statics:
        info = z.info
        unseen = accounting.unseen(info.id, model) if accounting is not None else (0, 0)
        # is_saturated, with the summary's part precomputed (the same sums, in order).
        saturated = z.full or z.busy + unseen[0] >= z.limit
        panicked = z.full_in_panic or z.busy + unseen[0] >= z.limit_in_panic
        kv_bound = z.kv_only and z.busy + unseen[0] < z.limit
        out.append(
            ZoneState(info.id, info, z.load, unseen[0], unseen[1], saturated, panicked, kv_bound)
        )
    return tuple(out)


def _zone_statics(view: RegionalView, model: str) -> tuple[ZoneStatic, ...]:
    settings = view.settings
    out: list[ZoneStatic] = []
    for info in view.zones.values():
        load = info.summary.load_for(model) if info.summary is not None else None
        if load is None:
            out.append(ZoneStatic(info, None, True, True, 0, 0, 0))
            continue
        kv_full = False
        if load.kv_blocks_total > 0:
            used = 1.0 - load.kv_blocks_free / load.kv_blocks_total
            kv_full = used >= settings.kv_cache_util_threshold
        no_room = load.max_running_requests == 0
        depth = settings.queue_depth_per_gpu
        out.append(
            ZoneStatic(
                info,
                load,
                no_room or load.healthy_gpus == 0 or kv_full,
                no_room or load.gpus == 0 or kv_full,
                load.running_requests + load.waiting_requests,
                load.max_running_requests + depth * load.healthy_gpus,
                load.max_running_requests + depth * load.gpus,
                kv_full and not no_room and load.healthy_gpus > 0,
            )
        )
    return tuple(out)


def capacity_health(zones: tuple[ZoneState, ...], model: str) -> tuple[int, int]:
    """(healthy GPUs, total GPUs) for ``model`` over the region's non-drained zones;
    a dark zone counts with its last known size and no healthy GPU."""
    healthy = total = 0
    for zone in zones:
        if zone.drained:
            continue
        if zone.load is not None:
            total += zone.load.gpus
            healthy += zone.load.healthy_gpus if zone.healthy else 0
            continue
        last = zone.info.last_summary
        remembered = last.load_for(model) if last is not None else None
        if remembered is not None:
            total += remembered.gpus
    return healthy, total


@dataclass(frozen=True, slots=True)
class ZoneContext:
    """What the zone-choice plugins read for one request, besides the request itself."""

    view: RegionalView
    #: Regions residency allows for this request (``None``: no restriction, tests only).
    allowed: frozenset[str] | None = None
    #: Envoy panic mode: health is ignored (see :mod:`regional_lb.priority`).
    panic: bool = False
    #: Prompt tokens one prefix block stands for (see :mod:`regional_lb.request`).
    tokens_per_block: float = 0.0
    #: Zones this request already failed on (retries go elsewhere).
    excluded: frozenset[str] = frozenset()

    @property
    def region(self) -> str:
        return self.view.region


class ZoneBatch(Batch):
    """One zone choice's candidates for :class:`gtm.routing.Runner`: the region's zones
    for the request's model by position (``zones[k]`` is ``ids[k]``), and the context.
    ``prepare`` is called with the :class:`RegionalView`."""

    __slots__ = ("ctx", "memo", "zones")

    request: RouteRequest

    def __init__(
        self, request: RouteRequest, zones: tuple[ZoneState, ...], ctx: ZoneContext
    ) -> None:
        super().__init__(tuple([z.id for z in zones]), request, ctx.view)
        self.zones = zones
        self.ctx = ctx
        #: Columns a plugin worked out for this decision (the TTFT costs, read by the
        #: scorer and by the cost model: one object, two extension points).
        self.memo: dict[object, object] = {}

"""The global tier's immutable view of the world, and the per-decision context.

A :class:`GlobalView` is what region choice reads: every region with its location,
jurisdiction labels, endpoints, health, drain state and load summary, plus the policy
in force. It is rebuilt (never mutated) whenever the fleet snapshot, the policy
generation or the health table changes, and swapped in with one reference assignment;
:attr:`GlobalView.revision` identifies it, so caches keyed on it (DNS answers, cached
decisions) are dropped exactly when something they depend on changed.

Regions come from three layers, later ones overriding earlier ones by id: the policy
set's Regions documents (which also define residency), the ``--topology`` file, and
the ``Region`` records in the state store (what ``gtm up`` and operators publish).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from global_lb import kernels
from gtm.models import Endpoint, GeoPoint, ModelLoad, Region, RegionSummary, merge_classes
from gtm.policy_store import ActivePolicy
from gtm.routing.cost import (
    RTT_INTERCEPT_MS,
    RTT_MS_PER_KM,
    prefill_terms,
    rtt_ms_from_distance,
)

#: The model name DNS decisions use: a DNS query names no model, so the region's
#: aggregate load over every model it serves stands in.
ANY_MODEL = "gtm:any-model"

#: RTT assumed from a client of unknown coordinates to every region: the model's
#: intercept. Equal for every region, so it leaves the choice to capacity and TTFT.
UNKNOWN_CLIENT_RTT_MS = rtt_ms_from_distance(0.0)
#: Mean Earth radius (IUGG), as in gtm.models.GeoPoint.distance_km.
EARTH_RADIUS_KM = 6371.0088
#: Client locations whose RTTs a view remembers (a view lives about a second).
_RTT_MEMO_SIZE = 65_536
#: An RTT not worked out yet (a NaN object of its own: never equal to a computed RTT).
_UNKNOWN = float("nan")


@dataclass(frozen=True, slots=True)
class ViewRevision:
    """Identifies a view: anything cached per view is keyed on this."""

    snapshot: int
    policy: int
    health: int
    #: The in-flight ledger's overlay on top of it (:mod:`global_lb.inflight`; 0: none).
    ledger: int = 0


@dataclass(frozen=True, slots=True)
class RegionState:
    """One region as region choice sees it (a routing candidate: ``.id``)."""

    id: str
    location: GeoPoint
    country: str
    #: The region's DNS label jurisdiction (``<jurisdiction>.api.<zone>``), may be "".
    jurisdiction: str
    endpoints: tuple[Endpoint, ...] = ()
    name: str = ""
    healthy: bool = True
    #: Why the region is unhealthy ("" when healthy), for traces.
    health_reason: str = ""
    drained: bool = False
    summary: RegionSummary | None = None
    #: Per-model load, and the aggregate over models under :data:`ANY_MODEL`.
    loads: Mapping[str, ModelLoad] = field(default_factory=lambda: MappingProxyType({}))
    #: :class:`ModelTerms` per model (derived from ``loads``; see :func:`terms_of`).
    terms: Mapping[str, ModelTerms] = field(default_factory=lambda: MappingProxyType({}))
    #: Locations of the view's unavailable regions (shared by every region of a view):
    #: lets a picker tell that a client was displaced from a nearer, failed region.
    outages: tuple[GeoPoint, ...] = ()

    @property
    def available(self) -> bool:
        return self.healthy and not self.drained

    def load(self, model: str) -> ModelLoad | None:
        return self.loads.get(model)

    def headroom(self, model: str) -> float:
        """Unused share of running-sequence capacity for ``model``, in [0, 1].

        Waiting requests count as used capacity: a region with a queue has no headroom.
        Without a summary the load is unknown and the region counts as idle (1.0), so a
        static deployment (no regional LBs publishing yet) still spreads evenly.
        """
        if self.summary is None:
            return 1.0
        terms = self.terms.get(model)
        return 0.0 if terms is None else terms.headroom

    def with_terms(self, terms: Mapping[str, ModelTerms]) -> RegionState:
        """This region with other terms (the in-flight ledger's charges on them).

        Copies the slots directly: ``dataclasses.replace`` inspects the fields on every
        call, ~10× slower, and the front door builds overlays between decisions."""
        new = object.__new__(RegionState)
        for name in RegionState.__slots__:
            object.__setattr__(new, name, getattr(self, name))
        object.__setattr__(new, "terms", terms)
        return new


class ModelTerms(NamedTuple):
    """A region's per-model numbers that every decision reads, computed once per view.

    ``queue_ms`` and ``ms_per_token`` price the region by the GPU that would take a
    request there, one line for every prompt size (:func:`gtm.routing.cost.
    prefill_terms`): its fastest free GPU (no wait, that class's per-token time) when
    no slower than its average GPU, else its pooled backlog at its average rate."""

    #: Queueing delay before the prefill starts, ms (∞: no capacity).
    queue_ms: float
    #: Prefill time per prompt token on the GPU that takes the request, ms.
    ms_per_token: float
    headroom: float
    #: At least one healthy GPU serves the model.
    serves: bool


def model_terms(
    load: ModelLoad, unseen_requests: float = 0, unseen_tokens: float = 0
) -> ModelTerms:
    """``load``'s terms; ``unseen_*``: requests and prompt tokens sent since the summary
    (the in-flight ledger, :mod:`global_lb.inflight`) take free GPUs, then count as
    waiting and queued."""
    serves = load.healthy_gpus > 0
    if load.max_running_requests == 0:
        headroom = 0.0
    else:
        busy = load.running_requests + load.waiting_requests + unseen_requests
        headroom = max(0.0, 1.0 - busy / load.max_running_requests)
    queue_ms, _, _ = terms = prefill_terms(load, unseen_requests, unseen_tokens)
    if not serves or math.isinf(queue_ms):
        return ModelTerms(math.inf, 0.0, headroom, serves)
    return ModelTerms(queue_ms, terms.ms_per_token, headroom, serves)


def terms_of(loads: Mapping[str, ModelLoad]) -> Mapping[str, ModelTerms]:
    return MappingProxyType({model: model_terms(load) for model, load in loads.items()})


def aggregate_load(models: Iterable[ModelLoad]) -> ModelLoad | None:
    """The sum of a region's per-model loads, as one :data:`ANY_MODEL` load (a GPU that
    serves several models counts in each, as in the sums)."""
    loads = tuple(models)
    if not loads:
        return None
    return ModelLoad(
        model=ANY_MODEL,
        gpus=sum(m.gpus for m in loads),
        healthy_gpus=sum(m.healthy_gpus for m in loads),
        prefill_tokens_per_s=math.fsum(m.prefill_tokens_per_s for m in loads),
        decode_tokens_per_s=math.fsum(m.decode_tokens_per_s for m in loads),
        queued_prefill_tokens=sum(m.queued_prefill_tokens for m in loads),
        running_requests=sum(m.running_requests for m in loads),
        waiting_requests=sum(m.waiting_requests for m in loads),
        max_running_requests=sum(m.max_running_requests for m in loads),
        kv_blocks_total=sum(m.kv_blocks_total for m in loads),
        kv_blocks_free=sum(m.kv_blocks_free for m in loads),
        classes=merge_classes(m.classes for m in loads),
    )


def loads_of(summary: RegionSummary | None) -> Mapping[str, ModelLoad]:
    if summary is None:
        return MappingProxyType({})
    loads = {m.model: m for m in summary.models}
    total = aggregate_load(summary.models)
    if total is not None:
        loads[ANY_MODEL] = total
    return MappingProxyType(loads)


class _Trig(NamedTuple):
    """A set of region places, ready for the great-circle distance: the coordinates of
    their unit vectors (one tuple per axis: what :func:`kernels.fill_chord_rtts` reads)."""

    ids: tuple[str, ...]
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    zs: tuple[float, ...]

    @classmethod
    def of(cls, places: tuple[tuple[str, float, float], ...]) -> _Trig:
        units = [_unit(lat, lon) for _, lat, lon in places]
        return cls(
            tuple(rid for rid, _, _ in places),
            tuple(u[0] for u in units),
            tuple(u[1] for u in units),
            tuple(u[2] for u in units),
        )


def _unit(lat: float, lon: float) -> tuple[float, float, float]:
    """The unit vector of a place on the sphere."""
    phi, lam = math.radians(lat), math.radians(lon)
    return (math.cos(phi) * math.cos(lam), math.cos(phi) * math.sin(lam), math.sin(phi))


class LatencyModel:
    """Client → region RTT: a measured map when it has the pair, else the distance fit.

    ``measured`` maps ``(client country, region id)`` to a P50 RTT in ms (for example
    from RUM or synthetic probes); the fallback is :func:`gtm.routing.cost.
    rtt_ms_from_distance` (26 ms + 0.0143 ms/km, fitted on the Azure inter-region RTTs).
    """

    def __init__(self, measured: Mapping[tuple[str, str], float] | None = None) -> None:
        self._measured = dict(measured or {})
        # RTTs are a pure function of (client point, country, region places); 50
        # great-circle distances per client are most of a decision's cost, and clients
        # repeat, so they are memoised across views (bounded, cleared when full).
        self._signatures: dict[tuple[tuple[str, float, float], ...], int] = {}
        self._memo: dict[tuple[float, float, str | None, int], Mapping[str, float]] = {}
        self._trig: dict[int, _Trig] = {}
        self._rows: dict[tuple[float, float, str | None, int], list[float]] = {}

    def signature(self, places: tuple[tuple[str, float, float], ...]) -> int:
        """A small id for a set of region places (ids and coordinates)."""
        found = self._signatures.get(places)
        if found is None:
            if len(self._signatures) >= 64:
                self._signatures.clear()
                self._memo.clear()
                self._rows.clear()
                self._trig.clear()
            found = self._signatures[places] = len(self._signatures) + 1
            self._trig[found] = _Trig.of(places)
        return found

    def rtts(
        self,
        signature: int,
        regions: tuple[RegionState, ...],
        point: GeoPoint | None,
        country: str | None,
    ) -> Mapping[str, float]:
        """RTT from a client to each of ``regions`` (whose places have ``signature``)."""
        # Unknown coordinates use an impossible point as their key (NaN never compares equal).
        lat, lon = (point.lat, point.lon) if point is not None else (999.0, 999.0)
        key = (lat, lon, country, signature)
        found = self._memo.get(key)
        if found is None:
            row = self.row(signature, regions, point, country, tuple(range(len(regions))))
            found = dict(zip((r.id for r in regions), row, strict=True))
            if len(self._memo) >= _RTT_MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = found
        return found

    def row(
        self,
        signature: int,
        regions: tuple[RegionState, ...],
        point: GeoPoint | None,
        country: str | None,
        positions: tuple[int, ...],
    ) -> tuple[float, ...]:
        """The RTTs to the regions at ``positions`` of ``regions``, in that order.

        Works out only those (a decision needs its allowed regions' RTTs: a handful for
        a residency-bound tenant) and remembers them per client across views; the rest
        of the client's row is filled when asked for. Each RTT is one region's formula,
        so it is the same number however the row was filled."""
        lat, lon = (point.lat, point.lon) if point is not None else (999.0, 999.0)
        key = (lat, lon, country, signature)
        found = self._rows.get(key)
        if found is None:
            if len(self._rows) >= _RTT_MEMO_SIZE:
                self._rows.clear()
            found = self._rows[key] = [_UNKNOWN] * len(regions)
        values = [found[i] for i in positions]
        if _UNKNOWN in values:  # the placeholder object (``in`` checks identity first)
            self._fill(found, signature, regions, point, country, positions)
            values = [found[i] for i in positions]
        return tuple(values)

    def _fill(
        self,
        row: list[float],
        signature: int,
        regions: tuple[RegionState, ...],
        point: GeoPoint | None,
        country: str | None,
        positions: tuple[int, ...],
    ) -> None:
        trig = self._trig.get(signature)
        if point is None or trig is None or self._measured:
            for i in positions:
                row[i] = self.rtt_ms(point, country, regions[i])
            return
        # The haversine of GeoPoint.distance_km as a chord between unit vectors (see
        # kernels.fill_chord_rtts), compiled: cheaper than a math.dist call per region,
        # and than numpy operations over every region on a cold cache (a residency-bound
        # decision needs a handful of them).
        here = _unit(point.lat, point.lon)
        per_radian = RTT_MS_PER_KM * 2.0 * EARTH_RADIUS_KM
        kernels.fill_chord_rtts(
            row, trig.xs, trig.ys, trig.zs, here, positions, RTT_INTERCEPT_MS, per_radian
        )

    @property
    def measured(self) -> Mapping[tuple[str, str], float]:
        return MappingProxyType(self._measured)

    def rtt_ms(self, point: GeoPoint | None, country: str | None, region: RegionState) -> float:
        if country is not None and self._measured:
            measured = self._measured.get((country, region.id))
            if measured is not None:
                return measured
        if point is None:
            return UNKNOWN_CLIENT_RTT_MS
        return rtt_ms_from_distance(point.distance_km(region.location))


@dataclass(frozen=True, slots=True)
class GlobalView:
    """Everything region choice reads, at one revision. Immutable; share freely."""

    revision: ViewRevision
    regions: tuple[RegionState, ...]
    policy: ActivePolicy
    latency: LatencyModel
    #: Jurisdiction id → ids of the regions inside it (a region is in every
    #: jurisdiction containing its country, plus its own label).
    jurisdictions: Mapping[str, frozenset[str]]
    #: The fleet snapshot is stale (the store is unreachable): serving the last one.
    stale: bool = False
    by_id: Mapping[str, RegionState] = field(init=False)
    #: Identifies the regions' ids and locations, for the latency model's RTT memo.
    signature: int = field(init=False, repr=False, compare=False)
    #: An overlay made from another one: that one's revision and the positions whose
    #: regions differ from it (bit mask), so per-view work is patched, not redone.
    since: tuple[ViewRevision, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", MappingProxyType({r.id: r for r in self.regions}))
        places = tuple((r.id, r.location.lat, r.location.lon) for r in self.regions)
        object.__setattr__(self, "signature", self.latency.signature(places))

    def rtts(self, point: GeoPoint | None, country: str | None) -> Mapping[str, float]:
        """RTT in ms from a client at ``point`` in ``country`` to every region."""
        return self.latency.rtts(self.signature, self.regions, point, country)

    def overlay(
        self,
        regions: tuple[RegionState, ...],
        ledger: int,
        since: tuple[ViewRevision, int] | None = None,
    ) -> GlobalView:
        """This view with ``regions`` — the same regions in the same order, other terms
        (:mod:`global_lb.inflight`) — at revision ``ledger`` of the in-flight ledger;
        ``since``: the overlay it was made from and the positions that differ from it.

        Copies the slots directly (see :meth:`RegionState.with_terms`); the places are
        the same, so the latency model's signature carries over."""
        if since is None:
            assert tuple(r.id for r in regions) == tuple(r.id for r in self.regions)
        new = object.__new__(GlobalView)
        for name in GlobalView.__slots__:
            object.__setattr__(new, name, getattr(self, name))
        base = self.revision
        revision = ViewRevision(base.snapshot, base.policy, base.health, ledger)
        object.__setattr__(new, "revision", revision)
        object.__setattr__(new, "regions", regions)
        object.__setattr__(
            new, "by_id", MappingProxyType(dict(zip(self.by_id, regions, strict=True)))
        )
        object.__setattr__(new, "since", since)
        return new

    @property
    def policy_revision(self) -> str:
        return self.policy.revision

    def available_ids(self) -> frozenset[str]:
        return frozenset(r.id for r in self.regions if r.available)


class RequestContext(NamedTuple):
    """The per-decision context plugins read: the view and what this request may use.

    (A NamedTuple: immutable and built in C, one per cold decision.)"""

    view: GlobalView
    #: Region ids residency allows for this request (the residency filter's input).
    allowed: frozenset[str]
    client_point: GeoPoint | None = None
    client_country: str | None = None
    #: Which residency rule produced ``allowed`` (for the filter's removal reasons).
    residency_rule: str = ""

    def rtt_ms(self, region: RegionState) -> float:
        found = self.rtts().get(region.id)
        if found is None:  # a candidate from outside the view
            return self.view.latency.rtt_ms(self.client_point, self.client_country, region)
        return found

    def rtts(self) -> Mapping[str, float]:
        return self.view.rtts(self.client_point, self.client_country)


# ---------------------------------------------------------------------------- building


def policy_regions(policy: ActivePolicy) -> dict[str, Region]:
    """The policy set's regions as ``gtm.models.Region`` records."""
    regions: dict[str, Region] = {}
    for rid, spec in policy.policy_set.regions.items():
        regions[rid] = Region(
            id=rid,
            name=spec.name,
            location=GeoPoint(lat=spec.location.lat, lon=spec.location.lon),
            jurisdiction=spec.jurisdiction or spec.country.lower(),
            country=spec.country,
            endpoints=tuple(Endpoint(url=e.url, address=e.address) for e in spec.endpoints),
        )
    return regions


def jurisdiction_members(
    policy: ActivePolicy, regions: Iterable[RegionState]
) -> Mapping[str, frozenset[str]]:
    members: dict[str, set[str]] = {}
    for jid, countries in policy.policy_set.jurisdictions.items():
        members[jid] = {r.id for r in regions if r.country in countries}
    for region in regions:
        if region.jurisdiction:
            members.setdefault(region.jurisdiction, set()).add(region.id)
    return MappingProxyType({k: frozenset(v) for k, v in sorted(members.items())})

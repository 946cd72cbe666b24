"""``headroom-spread-picker``: the best region, unless it is near saturation or the
client was displaced from a failed region — then spread over the next regions in
proportion to their headroom.

gdnsd issue #126: with nearest-available routing, a failed (or full) data centre's
whole load lands on the next-closest one, which then fails in turn. Here:

* the best region (highest total, ties to the smallest id) wins while its headroom for
  the model is above ``1 - saturation``, and the client has not been displaced;
* otherwise the pick is random among the best ``spread_over`` regions whose total is
  at least ``band`` × the best total, with probability proportional to each one's
  headroom (the best region included, with what it has left). If none has headroom,
  the best region is returned: the regional LB queues or spills within residency.

"Displaced" means one of the view's unavailable regions is nearer the client than the
best surviving region: that region's clients would otherwise all move to one neighbour.
The draw is seeded by the request id (``request_rng``), so a decision replays exactly,
and a DNS answer (whose request id is its geo cell) spreads cells, not packets.

This is the one implementation of the picker: the generic profile calls :meth:`pick`
over scored regions, the global fast path calls :meth:`spreads_at` and :meth:`draw`
over its columns.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from global_lb.view import RegionState
from gtm.errors import PluginError
from gtm.models import Frozen, RouteRequest
from gtm.routing import RngFactory, Scored, better, request_rng

TYPE_NAME = "headroom-spread-picker"

#: Spread once the best region is 85 % used: continuous-batching servers keep TTFT flat
#: until running sequences approach their limit, then queueing grows fast; starting to
#: spread a little before that leaves room for the summaries' publication delay.
DEFAULT_SATURATION = 0.85


class Params(Frozen):
    saturation: float = Field(default=DEFAULT_SATURATION, gt=0.0, le=1.0)
    spread_over: int = Field(default=3, ge=1, le=64)
    band: float = Field(default=0.25, ge=0.0, le=1.0)
    seed: int = 0


class HeadroomSpreadPicker:
    def __init__(
        self,
        name: str = TYPE_NAME,
        params: Params | None = None,
        rng_factory: RngFactory = request_rng,
    ) -> None:
        params = params or Params()
        self._name = name
        self._min_headroom = 1.0 - params.saturation
        self._spread_over = params.spread_over
        self._band = params.band
        self._seed = params.seed
        self._rng = rng_factory

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: RouteRequest, scored: Sequence[Scored[RegionState]], /) -> RegionState:
        if not scored:
            raise PluginError(f"picker {self._name!r} was given no candidates")
        best = 0
        for k in range(1, len(scored)):
            if better(scored[best], scored[k]) is scored[k]:
                best = k
        region = scored[best].candidate
        if not self.spreads(request, region):
            return region
        totals = [s.total for s in scored]
        order = sorted(range(len(scored)), key=lambda k: (-totals[k], scored[k].candidate.id))
        model = request.model
        headroom = [s.candidate.headroom(model) for s in scored]
        return scored[self.draw(request, order, totals, best, headroom)].candidate

    def spreads(self, request: RouteRequest, best: RegionState) -> bool:
        """Whether the pick is random for this request: the best region is near saturation
        or the client was displaced from a nearer, unavailable region."""
        return self.spreads_at(request, best, best.headroom(request.model))

    def spreads_at(self, request: RouteRequest, best: RegionState, headroom: float) -> bool:
        """:meth:`spreads` given the best region's headroom for the model."""
        return headroom <= self._min_headroom or _displaced(request, best)

    def draw(
        self,
        request: RouteRequest,
        order: Sequence[int],
        totals: Sequence[float],
        best: int,
        headroom: Sequence[float],
    ) -> int:
        """The headroom-weighted draw among the best: an index into ``totals`` (the
        candidates' totals, ``headroom`` their headroom for the model, ``order`` their
        indices by total descending then id ascending, ``best`` the best one's)."""
        floor = self._band * totals[best]
        # ``order`` is by total descending: the totals above the floor are its head.
        pool = [k for k in order[: self._spread_over] if totals[k] >= floor]
        weights = [headroom[k] for k in pool]
        total = sum(weights)
        if total <= 0.0:
            return best
        if len(pool) == 1:
            return pool[0]  # what any draw picks, without seeding a generator
        draw = self._rng(request, self._seed).random() * total
        for k, weight in zip(pool, weights, strict=True):
            draw -= weight
            if draw < 0.0:
                return k
        return pool[-1]


def _displaced(request: RouteRequest, best: RegionState) -> bool:
    """Whether an unavailable region is nearer the client than ``best``."""
    point = request.client.location
    if point is None or not best.outages:
        return False
    distance = point.distance_km(best.location)
    return any(point.distance_km(o) < distance for o in best.outages)

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

This is the one implementation of the picker: the runner calls :meth:`pick` over the
batch's totals, the global fast path calls :meth:`spreads` and :meth:`draw` over its
survivors' totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from global_lb.batch import GlobalCap, RegionBatch
from global_lb.ranking import ranked_order
from global_lb.view import RegionState
from gtm.models import Frozen, RouteRequest
from gtm.routing import Plugin, RngFactory, request_rng
from gtm.routing.framework import Floats
from gtm.routing.pickers.max_score import best_of

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


class HeadroomSpreadPicker(Plugin):
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({GlobalCap.HEADROOM_SPREAD})

    def __init__(
        self,
        name: str = TYPE_NAME,
        params: Params | None = None,
        rng_factory: RngFactory = request_rng,
    ) -> None:
        super().__init__(name)
        params = params or Params()
        self._min_headroom = 1.0 - params.saturation
        self._spread_over = params.spread_over
        self._band = params.band
        self._seed = params.seed
        self._rng = rng_factory

    def pick(self, batch: RegionBatch, totals: Floats, /) -> int:
        best = best_of(batch, totals)
        regions = batch.regions
        request: RouteRequest = batch.request  # type: ignore[assignment]
        if not self.spreads(request, regions[best]):
            return best
        batch.spread = True
        survivors = batch.survivors.tolist()
        live = totals[survivors].tolist()
        order = ranked_order([batch.ids[i] for i in survivors], live)
        headroom = [regions[i].headroom(request.model) for i in survivors]
        chosen: int = survivors[self.draw(request, order, live, survivors.index(best), headroom)]
        return chosen

    def spreads(
        self, request: RouteRequest, best: RegionState, headroom: float | None = None
    ) -> bool:
        """Whether the pick is random for this request: the best region is near saturation
        (``headroom``: its headroom for the model, when the caller has it) or the client
        was displaced from a nearer, unavailable region."""
        if headroom is None:
            headroom = best.headroom(request.model)
        return headroom <= self._min_headroom or (bool(best.outages) and _displaced(request, best))

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

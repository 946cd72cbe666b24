"""``weighted-random-picker``: a random survivor with probability proportional to its total.

Spreads load over good candidates instead of sending everything to the single best one,
as llm-d's weighted-random picker does. Candidates with a total of 0 are never chosen
unless every total is 0, in which case the choice is uniform. The draw comes from a
per-request random source seeded from ``(seed, request_id)`` (see
:mod:`gtm.routing.framework`), and walks the survivors in their given order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic

from gtm.errors import PluginError
from gtm.models import Frozen, RouteRequest
from gtm.routing.framework import C, RngFactory, Scored, request_rng, uniform_index

TYPE_NAME = "weighted-random-picker"


class Params(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class WeightedRandomPicker(Generic[C]):
    """P(candidate) = total / Σ totals."""

    def __init__(
        self,
        name: str = TYPE_NAME,
        params: Params | None = None,
        *,
        rng_for: RngFactory = request_rng,
    ) -> None:
        self._name = name
        self._seed = (params or Params()).seed
        self._rng_for = rng_for

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: RouteRequest, scored: Sequence[Scored[C]], /) -> C:
        if not scored:
            raise PluginError(f"picker {self._name!r} was given no candidates")
        rng = self._rng_for(request, self._seed)
        mass = sum(s.total for s in scored)
        if mass <= 0.0:
            return scored[uniform_index(rng, len(scored))].candidate
        target = rng.random() * mass
        cumulative = 0.0
        last_positive = scored[0]
        for entry in scored:
            if entry.total > 0.0:
                cumulative += entry.total
                last_positive = entry
                if target < cumulative:
                    return entry.candidate
        # Rounding can leave target a hair above the running sum: the last positive one.
        return last_positive.candidate

"""``weighted-random-picker``: a random survivor with probability proportional to its total.

Spreads load over good candidates instead of sending everything to the single best one,
as llm-d's weighted-random picker does. Candidates with a total of 0 are never chosen
unless every total is 0, in which case the choice is uniform. The draw comes from a
per-request random source seeded from ``(seed, request_id)`` (see
:mod:`gtm.routing.framework`), and walks the survivors in position order.
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing.framework import Batch, Floats, Plugin, RngFactory, request_rng, uniform_index

TYPE_NAME = "weighted-random-picker"


class Params(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class WeightedRandomPicker(Plugin):
    """P(candidate) = total / Σ totals."""

    def __init__(
        self,
        name: str = TYPE_NAME,
        params: Params | None = None,
        *,
        rng_for: RngFactory = request_rng,
    ) -> None:
        super().__init__(name)
        self._seed = (params or Params()).seed
        self._rng_for = rng_for

    def pick(self, batch: Batch, totals: Floats, /) -> int:
        survivors: list[int] = batch.survivors.tolist()
        live: list[float] = totals[survivors].tolist()
        rng = self._rng_for(batch.request, self._seed)
        mass = sum(live)
        if mass <= 0.0:
            return survivors[uniform_index(rng, len(survivors))]
        target = rng.random() * mass
        cumulative = 0.0
        last_positive = survivors[0]
        for position, total in zip(survivors, live, strict=True):
            if total > 0.0:
                cumulative += total
                last_positive = position
                if target < cumulative:
                    return position
        # Rounding can leave target a hair above the running sum: the last positive one.
        return last_positive

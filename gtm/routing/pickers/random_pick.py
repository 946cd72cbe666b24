"""``random-picker``: a uniformly random survivor, ignoring scores.

A baseline (and llm-d's ``random`` picker). The draw comes from a per-request
:class:`random.Random` seeded from ``(seed, request_id)``, so a replay of the same request
over the same candidates picks the same one (see :mod:`gtm.routing.framework`).
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing.framework import Batch, Floats, Plugin, RngFactory, request_rng, uniform_index

TYPE_NAME = "random-picker"
#: llm-d's configuration name for this picker, kept as a deprecated alias.
DEPRECATED_ALIASES = ("random",)


class Params(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class RandomPicker(Plugin):
    """Uniform over the survivors."""

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
        survivors = batch.survivors
        rng = self._rng_for(batch.request, self._seed)
        return int(survivors[uniform_index(rng, len(survivors))])

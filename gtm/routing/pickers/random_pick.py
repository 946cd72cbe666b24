"""``random-picker``: a uniformly random survivor, ignoring scores.

A baseline (and llm-d's ``random`` picker). The draw comes from a per-request
:class:`random.Random` seeded from ``(seed, request_id)``, so a replay of the same request
over the same candidates picks the same one (see :mod:`gtm.routing.framework`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic

from gtm.errors import PluginError
from gtm.models import Frozen, RouteRequest
from gtm.routing.framework import C, RngFactory, Scored, request_rng, uniform_index

TYPE_NAME = "random-picker"
#: llm-d's configuration name for this picker, kept as a deprecated alias.
DEPRECATED_ALIASES = ("random",)


class Params(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class RandomPicker(Generic[C]):
    """Uniform over the survivors."""

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
        return scored[uniform_index(rng, len(scored))].candidate

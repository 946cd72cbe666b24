"""``power-of-two-picker``: two random survivors, the better one wins.

"The power of two choices" (Mitzenmacher, IEEE TPDS 12(10), 2001; Azar et al., 1994):
sampling two bins and taking the less loaded one cuts the maximum load from
Θ(log n / log log n) to Θ(log log n) while reading only two candidates, and it keeps
router replicas that share stale load data from all herding onto the same "best"
candidate, as max-score picking does. Ray Serve's default request router and the
``power_of_two`` policies of the SGLang and vLLM routers work this way.

The two are distinct survivors drawn from a per-request random source seeded from
``(seed, request_id)``; "better" is the higher total, ties to the smaller id.
"""

from __future__ import annotations

from gtm.models import Frozen
from gtm.routing.framework import Batch, Floats, Plugin, RngFactory, request_rng, uniform_index
from gtm.routing.pickers.max_score import better

TYPE_NAME = "power-of-two-picker"


class Params(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class PowerOfTwoPicker(Plugin):
    """Better of two distinct random survivors."""

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
        n = len(survivors)
        if n == 1:
            return int(survivors[0])
        rng = self._rng_for(batch.request, self._seed)
        first = uniform_index(rng, n)
        # Draw the second from the other n - 1 so the two are always distinct.
        second = uniform_index(rng, n - 1)
        if second >= first:
            second += 1
        return better(batch, totals, int(survivors[first]), int(survivors[second]))

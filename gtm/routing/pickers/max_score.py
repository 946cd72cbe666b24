"""``max-score-picker``: the survivor with the highest total; ties to the smallest id.

Ties go to the smallest id, so the choice never depends on candidate order or on
anything outside the request and the view (llm-d's max-score picker breaks ties at
random; determinism matters more here because the simulator replays the same decisions).

Optional ``near_equal``: when several survivors are within that much total of the best,
take the better of two drawn at random among them (power of two choices, Mitzenmacher
2001), so that replicas sharing the same stale view do not all herd onto the single
"best" candidate. Draws come from the request's own random source (``(seed, request
id)``). Only the plain picker (``near_equal: 0``) declares
:attr:`~gtm.routing.framework.Capability.PICKS_MAX_TOTAL`, which fast paths rely on.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from gtm.models import Frozen
from gtm.routing.framework import Batch, Capability, Floats, Plugin, uniform_index

TYPE_NAME = "max-score-picker"


class Params(Frozen):
    near_equal: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int = 0


def best_of(batch: Batch, totals: Floats) -> int:
    """The survivor of highest total; on a tie the smallest id."""
    if batch.ids_ascending:  # the first of the tied positions is the smallest id
        if batch.all_alive:
            return int(totals.argmax())
        survivors = batch.survivors
        return int(survivors[totals[survivors].argmax()])
    positions: list[int] = batch.survivors.tolist()
    live: list[float] = totals[positions].tolist()
    top = max(live)
    if live.count(top) == 1:
        return positions[live.index(top)]
    ids = batch.ids
    return min(
        (k for k, total in zip(positions, live, strict=True) if total == top), key=ids.__getitem__
    )


def better(batch: Batch, totals: Floats, a: int, b: int) -> int:
    """The higher total of positions ``a`` and ``b``; on a tie the smaller id."""
    if totals[a] != totals[b]:
        return a if totals[a] > totals[b] else b
    return a if batch.ids[a] <= batch.ids[b] else b


class MaxScorePicker(Plugin):
    """Highest total wins; ties broken by the smallest id."""

    capabilities = frozenset({Capability.PICKS_MAX_TOTAL})

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)

    def pick(self, batch: Batch, totals: Floats, /) -> int:
        return best_of(batch, totals)


class NearEqualPicker(Plugin):
    """The better of two random survivors within ``near_equal`` of the best total."""

    def __init__(self, name: str, params: Params) -> None:
        super().__init__(name)
        self._near = params.near_equal
        self._seed = params.seed

    def pick(self, batch: Batch, totals: Floats, /) -> int:
        best = best_of(batch, totals)
        close = np.flatnonzero(batch.alive & (totals >= totals[best] - self._near))
        if len(close) < 2:
            return best
        rng = batch.rng(self._seed)
        first = uniform_index(rng, len(close))
        second = uniform_index(rng, len(close) - 1)
        if second >= first:
            second += 1
        return better(batch, totals, int(close[first]), int(close[second]))


def build(name: str, params: Params) -> MaxScorePicker | NearEqualPicker:
    """The registry's factory: the plain picker unless ``near_equal`` is set."""
    return NearEqualPicker(name, params) if params.near_equal > 0.0 else MaxScorePicker(name)

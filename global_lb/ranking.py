"""The survivors of a region decision, best first, and the fallbacks after its choice:
worked out when first read.

A decision needs only its region; the front door reads the fallbacks only when a
forward fails, and the scores only for ``POST /v1/route`` and ``gtm route``. So a
decision keeps the survivors' ids and totals (and, when the spread picker drew, the
order it drew from), and :class:`Ranking` orders them on demand, once (outcomes served
from the decision cache share it). Order: total descending, then id ascending (the
max-score picker's tie rule).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


def ranked_order(
    names: Sequence[str], totals: Sequence[float], ascending: bool = False
) -> list[int]:
    """Indices into ``names`` by total descending, then id ascending (``ascending``:
    the caller knows ``names`` are in id order)."""
    indices = range(len(totals))
    if ascending or all(a < b for a, b in itertools.pairwise(names)):
        return sorted(indices, key=totals.__getitem__, reverse=True)  # stable: ids stay in order
    return sorted(indices, key=lambda k: (-totals[k], names[k]))


class Ranking:
    """The survivors, best first, with their totals and the fallbacks after a choice
    (see the module docstring: ordering them was a large share of a cold decision)."""

    __slots__ = ("_best", "_chosen", "_fallbacks", "_names", "_order", "_scores", "_totals")

    def __init__(
        self,
        names: tuple[str, ...],
        totals: Sequence[float],
        best: int,
        chosen: int,
        order: Sequence[int] | None = None,
    ) -> None:
        #: The survivors' ids in view order, their totals, and the indices of the best
        #: and of the chosen one (they differ when the spread picker drew another).
        self._names = names
        self._totals = totals
        self._best = best
        self._chosen = chosen
        self._order = order
        self._scores: tuple[tuple[str, float], ...] | None = None
        self._fallbacks: tuple[str, ...] | None = None

    @classmethod
    def given(cls, scores: tuple[tuple[str, float], ...], fallbacks: tuple[str, ...]) -> Ranking:
        """A ranking already worked out (the generic profile's, or none)."""
        ranking = cls(tuple(r for r, _ in scores[:1]), (), 0, 0, ())
        ranking._scores = scores
        ranking._fallbacks = fallbacks
        return ranking

    @property
    def best(self) -> str | None:
        """The survivor with the highest total (``None``: no survivors)."""
        names = self._names
        return names[self._best] if names else None

    def head(self, n: int) -> tuple[str, ...]:
        """The first ``n`` :attr:`fallbacks`, without ordering the rest (a retry reads
        a few; ``heapq.nsmallest`` is a partial selection)."""
        if self._fallbacks is not None or self._order is not None:
            return self.fallbacks[:n]
        totals, names, chosen = self._totals, self._names, self._chosen
        top = heapq.nsmallest(n + 1, range(len(names)), key=lambda k: (-totals[k], names[k]))
        return tuple([names[k] for k in top if k != chosen][:n])

    def order(self) -> Sequence[int]:
        """Indices into the survivors by total descending, then id ascending."""
        found = self._order
        if found is None:
            found = self._order = ranked_order(self._names, self._totals)
        return found

    @property
    def scores(self) -> tuple[tuple[str, float], ...]:
        """(region id, total score) of the survivors, best first."""
        found = self._scores
        if found is None:
            order, names, totals = self.order(), self._names, self._totals
            found = self._scores = tuple(
                zip(map(names.__getitem__, order), map(totals.__getitem__, order), strict=True)
            )
        return found

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """The other survivors in that order."""
        found = self._fallbacks
        if found is None:
            chosen = self._chosen
            found = self._fallbacks = tuple([self._names[k] for k in self.order() if k != chosen])
        return found


#: No survivors (a refusal).
NO_RANKING = Ranking.given((), ())

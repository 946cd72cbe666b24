"""``max-score-picker``: the candidate with the highest total score.

Ties go to the smallest candidate id, so the choice never depends on candidate order or
on anything outside the request and the snapshot (llm-d's max-score picker breaks ties
at random instead; determinism matters more here because the simulator replays the same
decisions).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Generic

from gtm.errors import PluginError
from gtm.models import Frozen, RouteRequest
from gtm.routing.framework import C, Scored

TYPE_NAME = "max-score-picker"

_total = attrgetter("total")


class Params(Frozen):
    """No parameters."""


class MaxScorePicker(Generic[C]):
    """Highest total wins; ties broken by the smallest id."""

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: RouteRequest, scored: Sequence[Scored[C]], /) -> C:
        if not scored:
            raise PluginError(f"picker {self._name!r} was given no candidates")
        # C-level passes (max, index, count) instead of generators: this runs on every
        # decision over every survivor, and a tie is rare.
        totals = list(map(_total, scored))
        top = max(totals)
        if totals.count(top) == 1:
            return scored[totals.index(top)].candidate
        best = min((s for s in scored if s.total == top), key=lambda s: s.candidate.id)
        return best.candidate

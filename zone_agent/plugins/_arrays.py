"""Small array helpers shared by the plugins, and the base of the baselines that name
their choice."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gtm.routing.framework import Capability, Plugin
from zone_agent._np import fany
from zone_agent.view import Bools, Floats, Ints

if TYPE_CHECKING:
    from zone_agent.batch import ZoneBatch


def lower_is_better(values: Floats, alive: Bools) -> Floats:
    """Min-max normalise so the smallest alive value scores 1 and the largest 0.

    As llm-d's ``queue-scorer`` normalises queue sizes; all equal → every score is 1.
    """
    scores = np.zeros(len(values))
    if not fany(alive):
        return scores
    live = values[alive]
    low, high = float(live.min()), float(live.max())
    if high <= low:
        scores[alive] = 1.0
    else:
        scores[alive] = (high - values[alive]) / (high - low)
    return scores


def one_hot(size: int, position: int) -> Floats:
    """Score 1 for ``position``, 0 elsewhere: a policy that names its choice."""
    scores = np.zeros(size)
    scores[position] = 1.0
    return scores


def first_min(values: Floats, alive: Bools) -> int:
    """Position of the smallest alive value (ties: the lowest position = smallest id)."""
    return int(np.where(alive, values, np.inf).argmin())


def first_max(values: Floats, alive: Bools, all_alive: bool = False) -> int:
    """Position of the largest alive value (ties: the lowest position = smallest id)."""
    if all_alive:
        return int(values.argmax())
    return int(np.where(alive, values, -np.inf).argmax())


def first_max_of(values: Floats, survivors: Ints, all_alive: bool = False) -> int:
    """:func:`first_max` given the alive positions (ascending): a gather and an argmax
    over the survivors, instead of building a masked copy of every value with
    ``np.where``. (Same choice, except that when every alive value is −inf this one
    still names an alive position.)"""
    if all_alive:
        return int(values.argmax())
    return int(survivors[values[survivors].argmax()])


class OneHotPicker(Plugin):
    """A baseline that names its choice (round robin, consistent hashing...): a picker
    that ignores the totals, and also a scorer of 1 for its choice and 0 elsewhere, as
    profiles written before it was a picker use it under ``max-score-picker``."""

    capabilities = frozenset({Capability.SCORES_IN_RANGE})

    def choose(self, batch: ZoneBatch, /) -> int:
        """The survivor this baseline sends the request to."""
        raise NotImplementedError

    def pick(self, batch: ZoneBatch, totals: Floats, /) -> int:
        return self.choose(batch)

    def scores(self, batch: ZoneBatch, /) -> Floats:
        return one_hot(len(batch), self.choose(batch))

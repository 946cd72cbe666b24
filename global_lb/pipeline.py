"""The global tier's fast paths on the core runner.

The global tier decides with :class:`gtm.routing.Runner` over a
:class:`~global_lb.batch.RegionBatch`; its plugins (``global_lb/plugins``) prepare their
per-view columns (``prepare``) and answer the runner's filter, score and pick calls. A
cold decision is most of the tier's budget, and the runner's per-plugin calls over numpy
arrays cost more than the work over tens of regions, so the tier declares two fast paths
on its registry (:func:`register_fast_paths`), taken when every plugin of the profile
declares the capability a slot needs (:class:`~global_lb.batch.GlobalCap`):

* **filters** (``global-filters``): each filter's kept regions are a bit mask prepared
  per view (residency per allowed set, health per view, model per model); the survivors
  are their AND, remembered per view with the steps of the trace (numpy masks, reasons)
  under what a mask may depend on (allowed set, model, residency rule);
* **choice** (``global-choice`` with ``max-score-picker``, ``global-spread-choice``
  with ``headroom-spread-picker``): the scorers' survivor forms summed in profile order,
  the best (ties to the smallest id), then the spread picker's own test and draw. The
  usual profile (``ttft-scorer`` then ``load-scorer``) runs the fused total of
  :mod:`global_lb.plugins.ttft` over its survivors' rows (RTT + cost terms + headroom),
  remembered per view and client (clients repeat: cities, resolvers).

Every number comes from the plugins' own modules, so a fast decision is the runner's
reference decision (``Runner.reference``): ``tests/property/test_global_fast_path.py``
runs both on random views, requests and profiles. What a decision hands on is lazy: the
order of the survivors (:class:`~global_lb.ranking.Ranking`) is worked out when the
fallbacks or the scores are read, and the trace when it is read (``Outcome.to_decision``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import ClassVar, NamedTuple, cast

from global_lb.batch import (
    DecisionState,
    GlobalCap,
    MaskFilter,
    RegionBatch,
    changed_positions,
    remember,
)
from global_lb.plugins import load, spread, ttft
from global_lb.ranking import Ranking, ranked_order
from global_lb.view import GlobalView
from gtm.models import RouteRequest
from gtm.routing import Capability, FastPath, Match, PluginRegistry, Stage, Step, capabilities_of
from gtm.routing.framework import Bools, Ints

#: Filters and scorers a fast path takes (a profile with more runs without it, logged).
MAX_FILTERS = 8
MAX_SCORERS = 8
#: Client rows remembered per view (a view lives about a second; tens of regions × 3
#: floats a row, so the bound is a few tens of MB at most).
ROWS_MEMO_SIZE = 65_536


class ChoiceState(Ranking, DecisionState):
    """What the choice fast path worked out: the ranking, and the survivors' costs when
    it computed them (``ttft.ShiftedCosts`` when they share one per-token time)."""

    __slots__ = ("cost", "fixed", "per_token", "position")

    def __init__(
        self,
        ranking: tuple[tuple[str, ...], Sequence[float], int, int, Sequence[int] | None],
        costs: Sequence[float] | None,
        position: int,
    ) -> None:
        super().__init__(*ranking)
        chosen = self._chosen
        #: The chosen survivor's position and cost (None: no cost computed); a float,
        #: not the costs: cached decisions keep this object.
        self.position = position
        self.cost = None if costs is None else costs[chosen]
        #: Every survivor's per-token time when the choice holds for any prompt size,
        #: and the choice's prompt-independent cost.
        self.per_token: float | None = None
        self.fixed = 0.0
        if isinstance(costs, ttft.ShiftedCosts):
            self.per_token = costs.per_token
            self.fixed = costs.fixed(chosen)

    def priced(self) -> dict[int, float] | None:
        cost = self.cost
        return None if cost is None else {self.position: cost}


# ---------------------------------------------------------------------------- filters


class GlobalFilters:
    """The ``global-filters`` fast path: the AND of the filters' prepared masks."""

    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({Capability.PREPARE})

    def __init__(self, match: Match) -> None:
        self._filters = tuple(cast(MaskFilter, f) for f in match.filters)

    def prepare(self, view: GlobalView, /) -> dict[object, _Filtered]:
        """The view's survivors and filter steps, per allowed set, model and rule (what
        a mask filter's ``kept`` may depend on besides the view)."""
        return {}

    def filter(self, batch: RegionBatch, /) -> tuple[Step, ...] | None:
        memo: dict[object, _Filtered] = batch.prepared[self]
        key = (batch.allowed, batch.model, batch.rule)
        found = memo.get(key)
        if found is None:
            layout = batch.layout
            mask, steps = layout.full, []
            for f in self._filters:
                k = f.kept(batch)
                mask &= k
                full = k == layout.full
                steps.append(
                    Step.idle(f.name) if full else Step(f.name, layout.removed(k), f.reason(batch))
                )
            found = remember(memo, key, _Filtered(mask, tuple(steps), *layout.arrays(mask)))
        if not found.mask:
            return None  # a refusal: the filters one by one name the one that emptied it
        batch.alive = found.alive
        batch.all_alive = found.mask == batch.layout.full
        batch.seal(found.survivors)
        batch.mask = found.mask
        return found.steps


class _Filtered(NamedTuple):
    mask: int
    steps: tuple[Step, ...]
    alive: Bools
    survivors: Ints


# ---------------------------------------------------------------------------- choice


class Subset(NamedTuple):
    """A model's columns for the regions of one survivor mask (in position order)."""

    base: tuple[float, ...]
    per_token: tuple[float, ...]
    headroom: tuple[float, ...]
    #: See :attr:`Rows.uniform`.
    uniform: float | None


class Rows(NamedTuple):
    """The survivors' columns for one (client point, country, model, survivor mask),
    in position order: what a fused decision reads besides the prompt size."""

    #: ``rtt + base``: the prompt-independent part of the TTFT cost (ttft.fixed_column).
    fixed: tuple[float, ...]
    per_token: tuple[float, ...]
    headroom: tuple[float, ...]
    #: The smallest finite ``fixed`` (``None``: none is finite).
    low: float | None
    #: Every survivor's ``per_token`` when they are all equal (same GPUs everywhere).
    uniform: float | None


class ChoiceMemo:
    """The fused path's per-view memos: survivor subsets and client rows. A view over
    the same regions in the same places as the one before (an overlay: a few regions'
    terms differ) takes the previous view's entries whose survivors did not change."""

    __slots__ = ("changed", "parent", "rows", "subsets", "view")

    def __init__(self, view: GlobalView, previous: ChoiceMemo | None) -> None:
        self.view = view
        self.parent: ChoiceMemo | None = None
        self.subsets: dict[tuple[str, int], Subset] = {}
        self.rows: dict[tuple[float, float, str | None, str, int], Rows] = {}
        changed = None
        if previous is not None:
            old = previous.view
            if view.latency is old.latency and view.signature == old.signature:
                changed = changed_positions(old, view)
            previous.parent = None  # one level: a chain would keep every view
        full = (1 << len(view.regions)) - 1
        self.parent = previous if changed is not None and changed != full else None
        self.changed = changed or 0

    def inherited(self, memo: str, key: tuple[object, ...], mask: int) -> object:
        parent = self.parent
        if parent is None or mask & self.changed:
            return None
        found: object = getattr(parent, memo).get(key)
        return found


class GlobalChoice:
    """The ``global-choice`` / ``global-spread-choice`` fast paths: the scorers' survivor
    forms, the best, the spread picker's draw (see the module docstring)."""

    capabilities: ClassVar[frozenset[StrEnum]] = frozenset({Capability.PREPARE})

    def __init__(self, match: Match) -> None:
        self._scorers = tuple((ws.scorer, ws.weight) for ws in match.scorers)
        # Summed in profile order, like the runner's.
        self._weight_sum = functools.reduce(operator.add, (w for _, w in self._scorers), 0.0)
        picker = match.picker
        self._spread = (
            cast(spread.HeadroomSpreadPicker, picker)
            if GlobalCap.HEADROOM_SPREAD in capabilities_of(picker)
            else None
        )
        #: The TTFT and load scorers when the profile's scorers are exactly those two,
        #: with (w_ttft, w_load, Σw) and the TTFT scale.
        self._fused: tuple[ttft.TtftScorer, load.LoadScorer] | None = None
        self._fused_weights = (0.0, 0.0, 0.0)
        self._scale = 0.0
        if len(self._scorers) == 2:
            (first, w0), (second, w1) = self._scorers
            if GlobalCap.TTFT_SCORE in capabilities_of(first) and (
                GlobalCap.HEADROOM_SCORE in capabilities_of(second)
            ):
                self._fused = (cast(ttft.TtftScorer, first), cast(load.LoadScorer, second))
                self._fused_weights = (w0, w1, self._weight_sum)
                self._scale = self._fused[0].scale_ms
        self._last: ChoiceMemo | None = None

    def prepare(self, view: GlobalView, /) -> ChoiceMemo:
        found = self._last = ChoiceMemo(view, self._last)
        return found

    def choose(self, batch: RegionBatch, /) -> int:
        mask = batch.mask if batch.mask is not None else batch.survivor_mask()
        layout = batch.layout
        positions = layout.positions(mask)
        names = layout.names(mask)
        costs: Sequence[float] | None = None
        top = None
        known: Sequence[float] | None = None  # the survivors' headroom, when read
        request: RouteRequest = batch.request  # type: ignore[assignment]
        if self._fused is not None:
            rows = self._rows(batch, mask, positions)
            known = rows.headroom
            totals, costs, top = ttft.fused_totals(
                rows.fixed, rows.per_token, rows.uniform, rows.low, rows.headroom,
                request.input_tokens, self._fused_weights, self._scale,
            )  # fmt: skip
        elif not self._scorers:
            totals = [0.0] * len(positions)
        else:
            totals, costs = self._totals(batch, positions, names)
        # The best: highest total, ties to the smallest id (max-score-picker's rule).
        if layout.id_ordered:  # the first of equal maxima is the smallest id
            k = totals.index(max(totals)) if top is None else top
        else:
            k = min(range(len(totals)), key=lambda i: (-totals[i], names[i]))
        best = k
        picker = self._spread
        order = None
        if picker is not None:
            regions = batch.view.regions  # type: ignore[attr-defined]
            if picker.spreads(request, regions[positions[k]], None if known is None else known[k]):
                batch.spread = True
                # The draw's pool is the head of the ranking: order it (a sort keyed in C)
                # and keep the order for the ranking.
                order = ranked_order(names, totals, layout.id_ordered)
                if known is None:
                    known = [regions[i].headroom(request.model) for i in positions]
                k = picker.draw(request, order, totals, k, known)
        batch.state = ChoiceState((names, totals, best, k, order), costs, positions[k])
        return positions[k]

    def _totals(
        self, batch: RegionBatch, positions: tuple[int, ...], names: tuple[str, ...]
    ) -> tuple[list[float], Sequence[float] | None]:
        """``Σ wᵢ·sᵢ / Σ wᵢ`` of the survivors, summed left to right, and their TTFT
        costs when a TTFT scorer computed them."""
        costs: Sequence[float] | None = None
        sums: list[float] | None = None
        for scorer, w in self._scorers:
            if GlobalCap.TTFT_SCORE in capabilities_of(scorer):
                cost_scorer = cast(ttft.TtftScorer, scorer)
                if costs is None:
                    costs = cost_scorer.survivor_costs(batch, positions)
                column = ttft.scores_column(names, costs, cost_scorer.scale_ms)
            else:
                column = scorer.survivor_scores(batch, positions)  # type: ignore[attr-defined]
            if sums is None:
                sums = [w * s for s in column]
            else:
                sums = [t + w * s for t, s in zip(sums, column, strict=True)]
        assert sums is not None
        ws = self._weight_sum
        return [t / ws for t in sums], costs

    def _rows(self, batch: RegionBatch, mask: int, positions: tuple[int, ...]) -> Rows:
        """The survivors' :class:`Rows` for the batch's client, remembered per view."""
        memo: ChoiceMemo = batch.prepared[self]
        point, country = batch.point, batch.country
        lat, lon = (point.lat, point.lon) if point is not None else (999.0, 999.0)
        key = (lat, lon, country, batch.model, mask)
        found = memo.rows.get(key)
        if found is None:
            found = memo.inherited("rows", key, mask)  # type: ignore[assignment]
            if found is None:
                sub = self._subset(batch, memo, mask, positions)
                view: GlobalView = batch.view  # type: ignore[assignment]
                rtts = view.latency.row(view.signature, view.regions, point, country, positions)
                fixed = ttft.fixed_column(rtts, sub.base)
                found = Rows(fixed, sub.per_token, sub.headroom, ttft.lowest(fixed), sub.uniform)
            if len(memo.rows) >= ROWS_MEMO_SIZE:
                memo.rows.clear()
            memo.rows[key] = found
        return found

    def _subset(
        self, batch: RegionBatch, memo: ChoiceMemo, mask: int, positions: tuple[int, ...]
    ) -> Subset:
        key = (batch.model, mask)
        found = memo.subsets.get(key)
        if found is None:
            found = memo.inherited("subsets", key, mask)  # type: ignore[assignment]
        if found is None:
            assert self._fused is not None
            cost_scorer, load_scorer = self._fused
            base, per_token = cost_scorer.terms(batch)
            pick = _gather_of(positions)
            per_token = pick(per_token)
            uniform = per_token[0] if per_token.count(per_token[0]) == len(per_token) else None
            found = Subset(pick(base), per_token, pick(load_scorer.headroom(batch)), uniform)
            remember(memo.subsets, key, found)
        return found


def _gather_of(positions: tuple[int, ...]) -> Callable[[Sequence[float]], tuple[float, ...]]:
    """A gather of ``positions`` (``operator.itemgetter``: in C), always a tuple."""
    if len(positions) == 1:
        (only,) = positions
        return lambda values: (values[only],)
    return operator.itemgetter(*positions)


def register_fast_paths(registry: PluginRegistry) -> None:
    """Declare the global tier's fast paths on ``registry``."""
    masks = (GlobalCap.MASK_FILTER,) * MAX_FILTERS
    scores = (GlobalCap.SURVIVOR_SCORES,) * MAX_SCORERS
    registry.register_fast_path(
        FastPath("global-filters", Stage.FILTERS, masks[:1], GlobalFilters, optional=masks[1:])
    )
    for name, picker in (
        ("global-choice", Capability.PICKS_MAX_TOTAL),
        ("global-spread-choice", GlobalCap.HEADROOM_SPREAD),
    ):
        registry.register_fast_path(
            FastPath(name, Stage.CHOICE, (), GlobalChoice, optional=scores, picker=picker)
        )

"""The zone's fast paths (:data:`FAST_PATHS`, on the zone registry): shortcuts the core
runner takes when a profile's plugins declare the :class:`~zone_agent.batch.ZoneCapability`
values they rely on. Each gives what the plugins one by one give — the survivors, the
steps and their reasons, the choice — which ``tests/unit/zone_agent/test_fast_paths.py``
and ``tests/property/test_zone_agent_decisions.py`` check against
:meth:`gtm.routing.runner.Runner.reference` on random zones. Each class says what it
replaces and when it steps aside.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from gtm.routing.framework import Capability
from gtm.routing.runner import FastPath, Match, Stage, Step
from zone_agent._np import fany
from zone_agent.accounting import Accounting
from zone_agent.batch import StreamsHint, ZoneBatch, ZoneCapability
from zone_agent.costs import blend
from zone_agent.view import Bools, Ints, ModelIndex, ZoneView

if TYPE_CHECKING:  # the plugins declaring the capabilities the paths need
    from zone_agent.plugins.canary_filter import CanaryFilter
    from zone_agent.plugins.fits_filter import FitsFilter
    from zone_agent.plugins.health_filter import HealthFilter
    from zone_agent.plugins.model_filter import ModelFilter
    from zone_agent.plugins.slo_picker import SloPicker
    from zone_agent.plugins.ttft_scorer import TtftScorer

#: Up to this many accounting slots outside the survivors, their streams are subtracted
#: from the running total one at a time (a float operation each is cheaper than a gather).
STREAMS_OUTSIDE_MAX = 8


# ---------------------------------------------------------------------------- filters


class _Prepared(NamedTuple):
    """The fused filters' work that depends on the view alone (per model)."""

    alive: Bools
    survivors: Ints
    all_alive: bool
    #: The health and model steps; then all steps when nothing else removes.
    steps: tuple[Step, ...]
    idle_steps: tuple[Step, ...]
    #: :attr:`ZoneBatch.rate_sum` of ``alive``.
    rate_sum: float
    streams_hint: StreamsHint
    #: The model has one GPU and it is alive: the free-KV rule cannot remove it.
    lone: bool


class FusedFilters:
    """The default filter chain — health, model, fits, optionally canary — as one step,
    for the usual request (the runner runs the filters one by one for any other).

    The health and model filters depend on the view alone when no GPU is half-open, so
    their survivors and trace steps are worked out once per view and model
    (:meth:`prepare`), not once per request. The fits filter needs per-GPU work only for
    its free-KV rule (its scalar shortcut says when), and the canary filter removes
    nothing when no GPU is a canary and the request pins nothing. Each calls the
    plugin's own code, so the survivors, the steps and their reasons are those of the
    one-by-one run — but for the free-KV rule over a model's lone GPU, which is not
    asked: it removes a GPU only when another survivor has room, so never the last one
    (a single-worker zone's every request).
    """

    capabilities = frozenset({Capability.PREPARE})

    def __init__(self, match: Match) -> None:
        filters = cast(Any, match.filters)
        self._index_filters: tuple[HealthFilter, ModelFilter] = (filters[0], filters[1])
        self._fits: FitsFilter = filters[2]
        self._canary: CanaryFilter | None = filters[3] if len(filters) > 3 else None
        self._canary_step = tuple(Step.idle(f.name) for f in filters[3:])
        self._tail = (Step.idle(self._fits.name), *self._canary_step)

    def prepare(self, view: ZoneView, /) -> dict[str, _Prepared | None]:
        """The view's memo: each model's :class:`_Prepared` (None: no shortcut for that
        model in this view), worked out on the model's first request."""
        return {}

    def filter(self, batch: ZoneBatch, /) -> tuple[Step, ...] | None:
        request, index = batch.request, batch.index
        memo: dict[str, _Prepared | None] = batch.prepared[self]
        prepared = memo.get(index.model, _UNPREPARED)
        if prepared is _UNPREPARED:
            prepared = memo[index.model] = self._prepare(index, batch.view.accounting)
        if prepared is None:
            return None
        canary = self._canary
        if canary is not None and not canary.idle(request, index):
            return None
        need = self._fits.shortcut(request, index)
        if need is None:
            return None
        batch.alive, batch.all_alive = prepared.alive, prepared.all_alive
        batch.seal(prepared.survivors)
        removal = None if prepared.lone else self._fits.soft_removal(batch, need)
        if removal is None:
            batch._streams_hint = prepared.streams_hint
            batch._rate_sum = prepared.rate_sum
            return prepared.idle_steps
        # The free-KV rule removes only when some survivor has room: never all.
        batch.alive, batch.all_alive = np.greater(prepared.alive, removal.mask), False
        batch.seal()
        step = Step(self._fits.name, removal.mask, removal.reason)
        return (*prepared.steps, step, *self._canary_step)

    def _prepare(self, index: ModelIndex, accounting: Accounting) -> _Prepared | None:
        if index.any_half_open:
            return None  # the health filter then depends on our in-flight streams
        alive = index.all_true
        steps: list[Step] = []
        for plugin in self._index_filters:
            removal = plugin.index_removal(index)
            if removal is None:
                steps.append(Step.idle(plugin.name))
                continue
            alive = np.greater(alive, removal.mask)
            steps.append(Step(plugin.name, removal.mask, removal.reason))
            if not fany(alive):
                return None  # the one-by-one run refuses, naming the filter
        alive.flags.writeable = False
        survivors = alive.nonzero()[0]
        survivors.flags.writeable = False
        all_alive = alive is index.all_true
        rate_sum = index.rate_sum if all_alive else float(np.dot(index.rate, alive))
        slots = index.slots[survivors]
        slots.flags.writeable = False
        count = accounting.slot_count
        outside = sorted(set(range(count)).difference(slots.tolist()))
        hint = StreamsHint(
            slots, tuple(outside) if len(outside) <= STREAMS_OUTSIDE_MAX else None, count
        )
        lone = all_alive and len(survivors) == 1
        return _Prepared(
            alive, survivors, all_alive, tuple(steps), (*steps, *self._tail), rate_sum, hint, lone
        )


#: A model not worked out yet in a view's memo (typed as an entry: no isinstance test).
_UNPREPARED = cast(_Prepared, object())


# ---------------------------------------------------------------------------- choices


class CheapestPick:
    """A lone cost scorer (``ttft-scorer``) under a picker of the highest total: the
    choice is the survivor of lowest cost, found without working out the scores.

    The scorer scores ``exp((best − cost) / scale)``: 1 for the cheapest and strictly
    less for anything that costs more — except that exp of a tiny negative number
    rounds to 1, so a survivor costing a hair more than the best ties with it, and the
    picker takes the first of the tied. Only when a second survivor costs more than the
    best but within ``1e-9 × scale`` of it (where exp may round to 1; it surely does not
    below ``-1e-9``) are the scores worked out to pick, so the choice is always the
    picker's. (Survivors costing exactly the best tie at 1: argmin finds the first.) A
    model's lone GPU, alive, is the choice without a cost.
    """

    #: Costs this close to the best (in units of the scorer's scale) may tie with it.
    NEAR = 1e-9

    def __init__(self, match: Match) -> None:
        self._scorer = cast("TtftScorer", match.scorers[0].scorer)
        self._margin = self.NEAR * self._scorer.scale_ms

    def choose(self, batch: ZoneBatch, /) -> int:
        if batch.all_alive and len(batch.ids) == 1:
            return 0  # the one candidate is the picker's choice, whatever it scores
        costs = self._scorer.costs_ms(batch)
        if batch.all_alive:
            live = costs
            k = at = int(costs.argmin())
        else:
            survivors = batch.survivors
            live = costs[survivors]  # a copy
            at = int(live.argmin())
            k = int(survivors[at])
        best = live.item(at)
        if not best < math.inf:
            return -1
        if len(live) == 1:
            return k
        # The runner-up, by a second argmin with the best set aside (two C calls,
        # cheaper than comparing the whole array): the usual verdict, a clear winner.
        live[at] = math.inf
        second = live.item(live.argmin())
        live[at] = best  # ``costs`` itself when every candidate is alive: put it back
        if second > best + self._margin:
            return k
        near = np.count_nonzero(live <= best + self._margin)
        # Exact ties (an idle zone of one GPU type) all score exp(0) = 1, and argmin
        # found the first of them, as the picker would.
        if near != 1 and near != np.count_nonzero(live == best):
            return -1
        return k


class BlendPick:
    """A cost scorer (``ttft-scorer``) then a KV-room scorer (``kv-cache-scorer``) under
    a picker of the highest total — the default profile: the weighted sum and the pick
    of :mod:`zone_agent.costs.blend` in one call (its C kernel when built), so the choice
    is the runner's, without the per-scorer dispatch and the scores record (a trace
    works them out when asked). On a near tie between GPUs of different costs the kernel
    answers -1 and the numpy form decides (an exact tie of costs it decides itself). A
    model's lone GPU, alive, is the choice without a blend.
    """

    def __init__(self, match: Match) -> None:
        cost, room = match.scorers
        self._cost = cast("TtftScorer", cost.scorer)
        self._cost_weight, self._room_weight = float(cost.weight), float(room.weight)
        weight_sum = self._cost_weight + self._room_weight
        # Dividing by a power of two is exact and keeps every order and tie: skipped (0).
        self._div = 0.0 if math.frexp(weight_sum)[0] == 0.5 else weight_sum
        self._inv_scale = 1.0 / self._cost.scale_ms

    def choose(self, batch: ZoneBatch, /) -> int:
        if batch.all_alive and len(batch.ids) == 1:
            return 0  # the one candidate is the picker's choice, whatever it scores
        index = batch.index
        args = (
            self._cost.costs_ms(batch),
            batch.view.accounting.kv_blocks,
            index.slots,
            index.kv_own_base,
            index.kv_free_base,
            index.inv_kv_total,
            None if batch.all_alive else batch.survivors,
            self._inv_scale,
            self._cost_weight,
            self._room_weight,
            self._div,
        )
        form: Callable[..., int] | None = index.memo.get(blend.new_form)  # type: ignore[assignment]
        if form is None:
            form = index.memo[blend.new_form] = blend.new_form()
        choice = form(*args)
        if choice >= 0:
            return choice
        return blend.blend_choice_numpy(*args)


class SloBlendPick(BlendPick):
    """The default's scorers under ``slo-picker`` (the ``goodput`` profile): the
    picker's rule for a zone where every GPU is late, else the blend's choice as
    :class:`BlendPick` makes it (the picker then takes the highest total too)."""

    def __init__(self, match: Match) -> None:
        super().__init__(match)
        self._picker = cast("SloPicker", match.picker)

    def choose(self, batch: ZoneBatch, /) -> int:
        choice = self._picker.late_choice(batch)
        return choice if choice >= 0 else super().choose(batch)


Z = ZoneCapability

#: The zone's fast paths, in the order the runner tries them.
FAST_PATHS: tuple[FastPath, ...] = (
    FastPath(
        "fused-filters",
        Stage.FILTERS,
        needs=(Z.HEALTH, Z.MODEL, Z.FITS),
        optional=(Z.CANARY,),
        build=FusedFilters,
    ),
    FastPath(
        "cheapest-pick",
        Stage.CHOICE,
        needs=(Z.COST_SCORE,),
        build=CheapestPick,
        picker=Capability.PICKS_MAX_TOTAL,
    ),
    FastPath(
        "blend-pick",
        Stage.CHOICE,
        needs=(Z.COST_SCORE, Z.KV_ROOM),
        build=BlendPick,
        picker=Capability.PICKS_MAX_TOTAL,
    ),
    FastPath(
        "slo-blend-pick",
        Stage.CHOICE,
        needs=(Z.COST_SCORE, Z.KV_ROOM),
        build=SloBlendPick,
        picker=Z.PICKS_MAX_TOTAL_ON_TIME,
    ),
)

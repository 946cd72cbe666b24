"""The one routing runner: filters in order → weighted scorers → one picker, over columns.

Every tier decides with :class:`Runner`; tiers differ only in their data layout (a
:class:`~gtm.routing.framework.Batch`) and their plugins. A decision hands each plugin
that declares ``Capability.PREPARE`` its ``prepare(view)`` result (worked out once per
view), runs the filters (masks; the filter that empties the set is named by
``NoEligibleCandidate``), the scorers (each column checked in [0, 1], repaired and
recorded only when broken; totals ``Σ wᵢ·sᵢ / Σ wᵢ`` summed left to right), the picker and
the cost model. The :class:`Outcome` builds the decision record and its trace only when
asked. A tier's declared :class:`FastPath` replaces the filter chain or score-and-pick
when the profile's plugins declare the capabilities it needs; when they do not, the
profile says which plugin lacks what, once in the log and in the gauge
``gtm_routing_fast_path{tier,profile,path}``. See ``gtm/routing/README.md``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import operator
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import repeat
from typing import Any, Generic, NamedTuple, NoReturn, Protocol, TypeVar

import numpy as np

from gtm.errors import GtmError, NoEligibleCandidate, PluginError
from gtm.models import (
    CandidateScore,
    Decision,
    DecisionTrace,
    FilterStep,
    ScoreIssue,
    ScoreIssueKind,
    Tier,
)
from gtm.routing.framework import (
    Batch,
    Bools,
    Capability,
    CostModel,
    ExtensionPoint,
    Filter,
    Floats,
    Picker,
    Scorer,
    capabilities_of,
)
from gtm.routing.metrics import RoutingMetrics

B = TypeVar("B", bound=Batch)

log = logging.getLogger(__name__)

#: ``filter_name`` of the NoEligibleCandidate raised when no candidate was offered at all.
NO_CANDIDATES_OFFERED = "(input)"
#: Default of ``plugin_timing_every``: a timed decision runs its plugins one by one (no
#: fast path, an observation per plugin), several fast decisions' work; one in 256
#: keeps that under a percent of a tier's decision time and out of its p99, and still
#: gives several samples a second under load.
DEFAULT_PLUGIN_TIMING_EVERY = 256
#: Views whose ``prepare`` results are kept: the current one and one more (a trace read
#: later decides again over its older view). Each tier's runner sees its views in turn, and
#: a view's memos can be large: keeping more only gives the garbage collector more to walk.
PREPARED_VIEWS = 2

_Observe = Callable[[float], None]
#: Builds a NamedTuple from a tuple of its fields in C, as ``NamedTuple._make`` does: the
#: class's own ``__new__`` is a generated Python function (one call more per decision).
_new_tuple = tuple.__new__
_NO_OBSERVERS: Mapping[object, _Observe] = {}


@dataclass(frozen=True, slots=True)
class Weighted:
    """A scorer and its weight in a profile (weights live in configuration)."""

    scorer: Scorer
    weight: float = 1.0


class Step(NamedTuple):
    """One filter step: its mask (it may name positions already removed; None: removed
    nothing) and the reason of each position it removed."""

    plugin: str
    removed: Bools | None
    reason: Callable[[int], str]

    @classmethod
    def idle(cls, plugin: str) -> Step:
        """The step of a filter that removed nothing."""
        return cls(plugin, None, _never)


class Scored(NamedTuple):
    totals: Floats
    columns: tuple[tuple[str, Floats], ...]
    issues: tuple[ScoreIssue, ...] = ()


# ---------------------------------------------------------------------------- fast paths


class Stage(StrEnum):
    """What a fast path replaces."""

    FILTERS = "filters"  # the filter chain: sets the batch's survivors, returns the steps
    CHOICE = "choice"  # the scorers and the picker: returns the position


class FilterPath(Protocol):
    def filter(self, batch: Any, /) -> tuple[Step, ...] | None:
        """Seal the batch's survivors and return the steps, exactly as the filters one by
        one would; None: run them one by one (nothing of the batch changed)."""
        ...


class ChoicePath(Protocol):
    def choose(self, batch: Any, /) -> int:
        """The picker's position over the scorers' totals, or -1: score and pick."""
        ...


class Match(NamedTuple):
    """The profile's plugins a fast path is built from."""

    filters: tuple[Filter, ...]
    scorers: tuple[Weighted, ...]
    picker: Picker
    cost_model: CostModel | None


@dataclass(frozen=True, slots=True)
class FastPath:
    """A tier's declared shortcut: which plugins it needs, and how it is built.

    ``needs`` lists the capability each filter (``FILTERS``) or scorer (``CHOICE``) must
    declare, in profile order; ``optional`` lists trailing filters that may follow;
    ``picker`` is the capability the picker must declare (``CHOICE``).
    """

    name: str
    stage: Stage
    needs: tuple[StrEnum, ...]
    build: Callable[[Match], FilterPath | ChoicePath]
    optional: tuple[StrEnum, ...] = ()
    picker: StrEnum | None = None

    def missing(self, match: Match) -> str | None:
        """Why ``match`` cannot take this path (which plugin lacks what), or None."""
        filters = self.stage is Stage.FILTERS
        slots: Sequence[object] = match.filters if filters else [w.scorer for w in match.scorers]
        point = ExtensionPoint.FILTER if filters else ExtensionPoint.SCORER
        wanted = (*self.needs, *self.optional)
        for k, plugin in enumerate(slots):
            name = getattr(plugin, "name", type(plugin).__name__)
            label = f"{point} {name!r} ({type(plugin).__name__})"
            if k >= len(wanted):
                return f"{label} is one more than it takes ({len(wanted)})"
            if wanted[k] not in capabilities_of(plugin):
                return f"{label} lacks '{wanted[k]}'"
        if len(slots) < len(self.needs):
            return f"it needs {len(self.needs)} {point}s, the profile has {len(slots)}"
        picker = match.picker
        if self.picker is not None and self.picker not in capabilities_of(picker):
            return f"picker {picker.name!r} ({type(picker).__name__}) lacks '{self.picker}'"
        return None


# ---------------------------------------------------------------------------- outcome


class Outcome(NamedTuple, Generic[B]):
    """A decision: the chosen position and everything needed to explain it on demand
    (:meth:`to_decision`)."""

    runner: Runner[B]
    batch: B
    choice: int
    steps: tuple[Step, ...]
    #: The scores when the decision needed them; else None, and :attr:`totals` and
    #: :attr:`scores` are worked out when asked for.
    scored: Scored | None
    predicted_ttft_ms: float | None

    @property
    def choice_id(self) -> str:
        return self.batch.ids[self.choice]

    @property
    def totals(self) -> Floats:
        """Each position's weighted total (values of removed ones are ignored)."""
        return self._scored().totals

    @property
    def scores(self) -> tuple[tuple[str, Floats], ...]:
        return self._scored().columns

    def _scored(self) -> Scored:
        if self.scored is not None:
            return self.scored
        return self.runner.score(self.batch)

    def to_decision(self, top: int | None = -1) -> Decision:
        """The decision record, its trace holding the scores of the ``top`` best
        survivors and always the choice (None: all; -1: the profile's ``trace_scores``)."""
        runner = self.runner
        if top == -1:
            top = runner.trace_scores
        scored = self._scored()
        totals = scored.totals
        alive = self.batch.survivors
        keep = alive
        if top is not None and len(alive) > top:
            best = alive[np.argsort(-totals[alive], kind="stable")[:top]]
            keep = np.array(sorted({int(i) for i in best} | {self.choice}), dtype=np.intp)
        ids = self.batch.ids
        # Row k is ((scorer, its score of keep[k]), ...), built column by column in C.
        per_scorer = [zip(repeat(name), column[keep].tolist()) for name, column in scored.columns]
        rows = list(zip(*per_scorer, strict=True)) if per_scorer else [()] * len(keep)
        records = CandidateScore.batch([ids[i] for i in keep.tolist()], rows, totals[keep].tolist())
        trace = DecisionTrace(
            profile=runner.name,
            candidates=tuple(ids),
            filters=_filter_steps(self.steps, ids),
            scores=records,
            picker=runner.picker.name,
            weights=runner.weights,
            score_issues=scored.issues,
            scores_omitted=len(alive) - len(keep),
        )
        return Decision(
            request_id=self.batch.request.request_id,
            tier=runner.tier,
            choice=self.choice_id,
            trace=trace,
            predicted_ttft_ms=self.predicted_ttft_ms,
        )


def _filter_steps(steps: Sequence[Step], ids: Sequence[str]) -> tuple[FilterStep, ...]:
    """Trace records of the filter steps; each step counts only the positions still
    alive before it (the runner keeps the raw masks)."""
    out: list[FilterStep] = []
    alive: Bools | None = None  # None: all alive
    remaining = len(ids)
    for step in steps:
        mask = step.removed
        if mask is None:
            out.append(FilterStep(step.plugin, (), (), remaining))
            continue
        removed: list[int] = (mask if alive is None else mask & alive).nonzero()[0].tolist()
        alive = ~mask if alive is None else np.greater(alive, mask)
        remaining -= len(removed)
        out.append(
            FilterStep(
                step.plugin,
                tuple(ids[i] for i in removed),
                tuple((ids[i], step.reason(i)) for i in removed),
                remaining,
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------- runner


class Runner(Generic[B]):
    """One tier's routing profile: ``decide(batch) -> Outcome``.

    ``metrics`` (one :class:`RoutingMetrics` per registry) turns on the decision and
    per-plugin latency histograms, the refusal and score-repair counters and the fast
    path gauge; ``timer`` measures them (injectable for tests). ``trace_scores`` keeps
    the N best survivors' scores in a trace (None: all). The arguments are valid as
    :class:`~gtm.routing.registry.ProfileSpec` validated them (the one way a profile is
    built: :meth:`~gtm.routing.registry.PluginRegistry.build`).
    """

    def __init__(
        self,
        name: str,
        tier: Tier,
        filters: Sequence[Filter],
        scorers: Sequence[Weighted],
        picker: Picker,
        *,
        cost_model: CostModel | None = None,
        fast_paths: Sequence[FastPath] = (),
        metrics: RoutingMetrics | None = None,
        timer: Callable[[], float] = time.perf_counter,
        plugin_timing_every: int = DEFAULT_PLUGIN_TIMING_EVERY,
        trace_scores: int | None = None,
    ) -> None:
        self.name = name
        self.tier = tier
        self.filters = tuple(filters)
        self._idle_steps = tuple(Step.idle(f.name) for f in self.filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self.cost_model = cost_model
        readers: list[Any] = [*self.filters, *(ws.scorer for ws in self.scorers), picker]
        for plugin in readers:
            if Capability.READS_COST_MODEL not in capabilities_of(plugin):
                continue
            if cost_model is None:
                raise PluginError(
                    f"{plugin.name!r} reads the profile's cost model: set profile.cost_model"
                )
            plugin.bind_cost_model(cost_model)
        self.trace_scores = trace_scores
        self.weights = tuple((ws.scorer.name, float(ws.weight)) for ws in scorers)
        # Summed left to right, the order the totals are summed in.
        self._weight_sum = functools.reduce(operator.add, (w for _, w in self.weights), 0.0)
        self._in_range = tuple(
            Capability.SCORES_IN_RANGE in capabilities_of(ws.scorer) for ws in scorers
        )
        self._metrics = metrics
        self._timer = timer
        self.plugin_timing_every = self._timing_every = plugin_timing_every
        self._decisions = itertools.count()
        self._observe = self._observers(metrics)
        self._decision_obs = (
            None if metrics is None else metrics.decision_duration.labels(tier, name).observe
        )
        #: Names of the fast paths this profile takes.
        self.fast_paths: tuple[str, ...] = ()
        match = Match(self.filters, self.scorers, picker, cost_model)
        self._filter_path: FilterPath | None = self._compose(Stage.FILTERS, match, fast_paths)
        self._choice_path: ChoicePath | None = self._compose(Stage.CHOICE, match, fast_paths)
        plugins: list[object] = [*self.filters, *(ws.scorer for ws in self.scorers), picker]
        plugins += [cost_model, self._filter_path, self._choice_path]
        self._preparers = tuple(
            dict.fromkeys(p for p in plugins if Capability.PREPARE in capabilities_of(p))
        )
        self._prepared: dict[int, tuple[object, dict[object, Any]]] = {}
        self._last_prepared: tuple[object, dict[object, Any]] | None = None

    # ------------------------------------------------------------------ building

    def _compose(self, stage: Stage, match: Match, declared: Sequence[FastPath]) -> Any:
        chosen: Any = None
        why: list[str] = []
        for path in declared:
            if path.stage is not stage:
                continue
            missing = path.missing(match) if chosen is None else "another path is in use"
            if missing is None:
                chosen = path.build(match)
                self.fast_paths += (path.name,)
            else:
                why.append(f"{path.name}: {missing}")
            if self._metrics is not None:
                gauge = self._metrics.fast_path.labels(self.tier, self.name, path.name)
                gauge.set(int(missing is None))
        if chosen is None and why:
            log.info(
                "%s profile %r runs its %s without a fast path: %s",
                self.tier,
                self.name,
                "filters" if stage is Stage.FILTERS else "scorers and picker",
                "; ".join(why),
            )
        return chosen

    def _observers(self, metrics: RoutingMetrics | None) -> dict[object, _Observe]:
        if metrics is None:
            return {}
        labels = metrics.plugin_duration.labels
        return {
            (point, id(plugin)): labels(self.tier, point, plugin.name).observe
            for point, plugins in (
                (ExtensionPoint.FILTER, self.filters),
                (ExtensionPoint.SCORER, [ws.scorer for ws in self.scorers]),
                (ExtensionPoint.PICKER, [self.picker]),
                (ExtensionPoint.COST_MODEL, [self.cost_model] if self.cost_model else []),
            )
            for plugin in plugins
        }

    def reference(self) -> Runner[B]:
        """The same plugins deciding one by one (no fast paths): the reference."""
        return Runner(
            self.name,
            self.tier,
            self.filters,
            self.scorers,
            self.picker,
            cost_model=self.cost_model,
            timer=self._timer,
            plugin_timing_every=self._timing_every,
            trace_scores=self.trace_scores,
        )

    # ------------------------------------------------------------------ decisions

    def decide(self, batch: B, pre: Step | None = None) -> Outcome[B]:
        """Choose a position of ``batch``. ``pre``: positions the tier removed before
        the filters (a retry's tried candidates), a step of the trace.

        Raises:
            NoEligibleCandidate: a filter removed every candidate (``filter_name``),
                or none was offered (:data:`NO_CANDIDATES_OFFERED`).
            PluginError: a plugin raised something that is not a GtmError, or broke
                its contract.
        """
        started = self._timer() if self._decision_obs is not None else 0.0
        if not len(batch.ids):
            self._refuse(NO_CANDIDATES_OFFERED, batch, ())  # nothing offered
        observe = _NO_OBSERVERS
        if self._observe and next(self._decisions) % self._timing_every == 0:
            observe = self._observe
        if self._preparers:
            last = self._last_prepared
            view = batch.view
            batch.prepared = (
                last[1] if last is not None and last[0] is view else self._prepare(view)
            )
        steps = None
        if self._filter_path is not None and pre is None and not observe:
            steps = self._filter_path.filter(batch)
        if steps is None:
            steps = self._filter(batch, pre, observe)
        choice = -1
        scored = None
        if self._choice_path is not None and not observe:
            choice = self._choice_path.choose(batch)
        if choice < 0:
            scored = self.score(batch, observe)
            choice = self._pick(batch, scored.totals, observe)
        predicted = None
        model = self.cost_model
        if model is not None:
            t0 = self._timer() if observe else 0.0
            try:
                cost = float(model.costs_ms(batch)[choice])
            except Exception as exc:
                _reraise(ExtensionPoint.COST_MODEL, model, exc)
            if observe:
                observe[(ExtensionPoint.COST_MODEL, id(model))](self._timer() - t0)
            # An infinite cost (nothing serves there) or a negative one is no prediction.
            predicted = cost if 0.0 <= cost < math.inf else None
        if self._decision_obs is not None:
            self._decision_obs(self._timer() - started)
        return _new_tuple(Outcome, (self, batch, choice, steps, scored, predicted))

    def _prepare(self, view: object) -> dict[object, Any]:
        found = self._prepared.get(id(view))
        if found is None or found[0] is not view:
            done: dict[object, Any] = {}
            for plugin in self._preparers:
                try:
                    done[plugin] = plugin.prepare(view)  # type: ignore[attr-defined]
                except Exception as exc:
                    _reraise("preparing", plugin, exc)
            if len(self._prepared) >= PREPARED_VIEWS:
                del self._prepared[next(iter(self._prepared))]
            found = self._prepared[id(view)] = (view, done)
        self._last_prepared = found
        return found[1]

    def _filter(
        self, batch: B, pre: Step | None, observe: Mapping[object, _Observe]
    ) -> tuple[Step, ...]:
        steps: list[Step] = []
        if pre is not None and pre.removed is not None:
            self._remove(batch, pre, steps)
        timer, plugin = self._timer, None
        try:
            for plugin, idle in zip(self.filters, self._idle_steps, strict=True):
                t0 = timer() if observe else 0.0
                removal = plugin.removes(batch)
                if observe:
                    observe[(ExtensionPoint.FILTER, id(plugin))](timer() - t0)
                if removal is None:
                    steps.append(idle)
                else:
                    self._remove(batch, Step(plugin.name, removal.mask, removal.reason), steps)
        except Exception as exc:
            _reraise(ExtensionPoint.FILTER, plugin, exc)
        batch.seal()
        return tuple(steps)

    def _remove(self, batch: B, step: Step, steps: list[Step]) -> None:
        """Apply a step's removals (the survivors: alive AND NOT mask, for booleans
        alive > mask); refuse when it leaves none."""
        steps.append(step)
        alive = batch.alive
        assert step.removed is not None
        kept = np.greater(alive, step.removed)
        if not kept[kept.argmax()]:
            self._refuse(step.plugin, batch, steps, alive)
        batch.alive, batch.all_alive = kept, False

    def score(self, batch: B, observe: Mapping[object, _Observe] = _NO_OBSERVERS) -> Scored:
        """The scorers' columns and the weighted totals (also a trace's rescoring)."""
        columns: list[tuple[str, Floats]] = []
        issues: list[ScoreIssue] = []
        totals: Floats | None = None
        n = len(batch.ids)
        timer, scorer = self._timer, None
        try:
            for ws, in_range in zip(self.scorers, self._in_range, strict=True):
                scorer = ws.scorer
                t0 = timer() if observe else 0.0
                column = scorer.scores(batch)
                if observe:
                    observe[(ExtensionPoint.SCORER, id(scorer))](timer() - t0)
                if type(column) is not np.ndarray:
                    column = np.asarray(column, dtype=np.float64)
                if len(column) != n:
                    raise ValueError(f"{len(column)} scores for {n} candidates")
                # Only the survivors' scores count, but a scorer may leave removed
                # positions out of range: those are clamped too (no issue recorded), or
                # weighing them could overflow. NaN fails both comparisons of the check.
                if not in_range and not _in_range(column):
                    if batch.all_alive or not _in_range(column[batch.survivors]):
                        column = self._repair(scorer.name, column, batch, issues)
                    else:
                        column = _clamped(column)
                columns.append((scorer.name, column))
                if totals is None:
                    totals = column if ws.weight == 1.0 else column * ws.weight
                else:
                    totals = totals + column * ws.weight
        except Exception as exc:
            _reraise(ExtensionPoint.SCORER, scorer, exc)
        if totals is None:
            return Scored(np.zeros(n), ())
        if len(self.scorers) > 1 or self._weight_sum != 1.0:
            totals = totals / self._weight_sum
        return Scored(totals, tuple(columns), tuple(issues))

    def _repair(self, name: str, column: Floats, batch: B, issues: list[ScoreIssue]) -> Floats:
        """Clamp to [0, 1], NaN → 0; each survivor's repair is a :class:`ScoreIssue`."""
        found: list[ScoreIssue] = []
        ids = batch.ids
        for position in batch.survivors.tolist():
            value = float(column[position])
            kind = (
                ScoreIssueKind.NAN
                if math.isnan(value)
                else ScoreIssueKind.BELOW
                if value < 0.0
                else ScoreIssueKind.ABOVE
                if value > 1.0
                else None
            )
            if kind is not None:
                found.append(ScoreIssue(plugin=name, candidate=ids[position], kind=kind))
        if self._metrics is not None:
            for kind, count in Counter(issue.kind for issue in found).items():
                self._metrics.score_issues.labels(self.tier, name, kind).inc(count)
        issues.extend(found)
        return _clamped(column)

    def _pick(self, batch: B, totals: Floats, observe: Mapping[object, _Observe]) -> int:
        picker = self.picker
        t0 = self._timer() if observe else 0.0
        try:
            choice: int = picker.pick(batch, totals)
        except Exception as exc:
            _reraise(ExtensionPoint.PICKER, picker, exc)
        if observe:
            observe[(ExtensionPoint.PICKER, id(picker))](self._timer() - t0)
        if not (0 <= choice < len(batch.ids)) or not batch.alive[choice]:
            raise PluginError(f"picker {picker.name!r} chose position {choice}, not a survivor")
        return choice

    def _refuse(
        self, filter_name: str, batch: B, steps: Sequence[Step], before: Bools | None = None
    ) -> NoReturn:
        """Raise NoEligibleCandidate naming the filter (``before``: the survivors its step
        removed); the trace is built when read."""
        if self._metrics is not None:
            self._metrics.no_eligible.labels(self.tier, self.name, filter_name).inc()
        ids, why = batch.ids, "no candidates offered"
        if before is not None:
            first = int(before.argmax())
            why = f"removed all {int(before.sum())}, e.g. {ids[first]!r}: {steps[-1].reason(first)}"
        steps = tuple(steps)

        def trace() -> DecisionTrace:
            return DecisionTrace(
                profile=self.name,
                candidates=tuple(ids),
                filters=_filter_steps(steps, ids),
                picker=self.picker.name,
                weights=self.weights,
            )

        raise NoEligibleCandidate(filter_name, why, trace=trace)


def _reraise(point: str, plugin: Any, exc: Exception) -> NoReturn:
    """A plugin's GtmError as it is; anything else as a PluginError naming the plugin."""
    if isinstance(exc, GtmError):
        raise exc
    name = getattr(plugin, "name", "?")
    raise PluginError(f"{point} plugin {name!r} failed: {type(exc).__name__}: {exc}") from exc


def _in_range(column: Floats) -> bool:
    """Whether every value is in [0, 1] (one reduction each way: cheaper than a mask)."""
    return bool(column[column.argmin()] >= 0.0 and column[column.argmax()] <= 1.0)


def _clamped(column: Floats) -> Floats:
    """``column`` in [0, 1]: NaN → 0, the rest clamped (a new array)."""
    return np.clip(np.nan_to_num(column, nan=0.0), 0.0, 1.0)


def _never(position: int) -> str:
    return "not removed"

"""The object/dict routing runner, kept only while a tier still uses it.

Candidates are objects, filters return :class:`FilterResult`, scorers ``{id: score}``
dicts, pickers get :class:`Scored` pairs. Superseded by the columnar runner
(:mod:`gtm.routing.runner`); removed once no tier imports it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Generic, NamedTuple, Protocol, TypeVar, cast, runtime_checkable

from pydantic import Field, model_validator

from gtm.errors import ConfigError, GtmError, NoEligibleCandidate, PluginError, RoutingError
from gtm.models import (
    CandidateScore,
    Decision,
    DecisionTrace,
    FilterStep,
    Frozen,
    RouteRequest,
    ScoreIssue,
    ScoreIssueKind,
    Tier,
)
from gtm.routing.framework import ExtensionPoint, RngFactory, request_rng, uniform_index
from gtm.routing.metrics import RoutingMetrics


# ------------------------------------------------------------ old framework.py
class Candidate(Protocol):
    """Anything a tier routes to. Ids are unique within one decision."""

    @property
    def id(self) -> str: ...


C = TypeVar("C", bound=Candidate)
C_contra = TypeVar("C_contra", bound=Candidate, contravariant=True)
X_contra = TypeVar("X_contra", contravariant=True)


# ---------------------------------------------------------------------------- filters
@dataclass(frozen=True, slots=True)
class FilterResult(Generic[C]):
    """What a filter kept, in input order, and ``(candidate id, reason)`` per removal.

    Every input candidate is either kept or removed; the runner checks the counts add up.
    """

    kept: tuple[C, ...]
    removed: tuple[tuple[str, str], ...] = ()

    @classmethod
    def keep_all(cls, candidates: Sequence[C]) -> FilterResult[C]:
        return cls(tuple(candidates))


def partition(candidates: Sequence[C], why_removed: Callable[[C], str | None]) -> FilterResult[C]:
    """Split candidates with ``why_removed(candidate)``: ``None`` keeps it, a string removes it.

    The easy way to write a filter; a filter on a hot path may build its
    :class:`FilterResult` directly.
    """
    kept: list[C] = []
    removed: list[tuple[str, str]] = []
    for candidate in candidates:
        reason = why_removed(candidate)
        if reason is None:
            kept.append(candidate)
        else:
            removed.append((candidate.id, reason))
    return FilterResult(tuple(kept), tuple(removed))


@runtime_checkable
class Filter(Protocol[C, X_contra]):
    """Removes candidates that must not serve the request (residency, health, model...)."""

    @property
    def name(self) -> str: ...

    def filter(
        self, request: RouteRequest, candidates: Sequence[C], ctx: X_contra, /
    ) -> FilterResult[C]: ...


# ---------------------------------------------------------------------------- scorers
@runtime_checkable
class Scorer(Protocol[C_contra, X_contra]):
    """Rates each candidate in [0, 1], higher is better.

    Returns candidate id → score. The runner clamps to [0, 1]; NaN and missing ids become
    0. Each repair is counted and traced, because it means the scorer has a bug.
    """

    @property
    def name(self) -> str: ...

    def score(
        self, request: RouteRequest, candidates: Sequence[C_contra], ctx: X_contra, /
    ) -> Mapping[str, float]: ...


@runtime_checkable
class CostModel(Protocol[C_contra, X_contra]):
    """Predicts the request's time-to-first-token at a candidate, in ms (ARCHITECTURE §2).

    A profile with a cost model reports the chosen candidate's cost as
    ``Decision.predicted_ttft_ms``. A scorer that ranks by predicted TTFT usually is the
    cost model too: one object, referenced as both.
    """

    @property
    def name(self) -> str: ...

    def cost_ms(self, request: RouteRequest, candidate: C_contra, ctx: X_contra, /) -> float: ...


# ---------------------------------------------------------------------------- pickers
class Scored(NamedTuple, Generic[C]):
    """A surviving candidate and its weighted total score in [0, 1]."""

    candidate: C
    total: float


@runtime_checkable
class Picker(Protocol[C]):
    """Chooses one candidate among the scored survivors (never given an empty sequence)."""

    @property
    def name(self) -> str: ...

    def pick(self, request: RouteRequest, scored: Sequence[Scored[C]], /) -> C: ...


def better(a: Scored[C], b: Scored[C]) -> Scored[C]:
    """The higher total; on a tie the smaller id, so the outcome never depends on order."""
    if a.total != b.total:
        return a if a.total > b.total else b
    return a if a.candidate.id <= b.candidate.id else b


# ------------------------------------------------------------ old profile.py
X = TypeVar("X")

#: ``filter_name`` of the NoEligibleCandidate raised when no candidate was offered at all.
NO_CANDIDATES_OFFERED = "(input)"
#: Upper bound on a scorer weight: keeps Σ w finite; config weights are small (llm-d uses 1–3).
MAX_WEIGHT = 1e6
#: Default of ``plugin_timing_every``. Timing each plugin of a 3-filter, 3-scorer profile
#: costs ~8 µs a decision (one ~1 µs histogram observation per plugin, measured on
#: CPython 3.11 with prometheus_client 0.26), a sixth of the global tier's 50 µs budget
#: (issue 7); one decision in 16 still gives a tier at 1,000 decisions/s ~60 samples a
#: second per plugin, plenty for latency quantiles.
DEFAULT_PLUGIN_TIMING_EVERY = 16

_Observe = Callable[[float], None]
_PLAIN_NUMBERS = (float, int)
_candidate_id = attrgetter("id")
#: ``Scored(candidate, total)`` without the NamedTuple's Python-level ``_make``.
_new_tuple = tuple.__new__
_PAIR_TYPES = frozenset({tuple, list})
_TUPLE = frozenset({tuple})
_STR = frozenset({str})


def _ignore(_seconds: float) -> None:
    """Stands in for a histogram's ``observe`` when the profile has no metrics."""


@dataclass(frozen=True, slots=True)
class WeightedScorer(Generic[C, X]):
    """A scorer and its weight in a profile (weights live in configuration)."""

    scorer: Scorer[C, X]
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Choice(Generic[C]):
    """The chosen candidate object and the decision record about it."""

    candidate: C
    decision: Decision


def _plugin_failed(point: ExtensionPoint, name: str, exc: Exception) -> PluginError:
    return PluginError(f"{point} plugin {name!r} failed: {type(exc).__name__}: {exc}")


def _unique_names(point: ExtensionPoint, names: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if not name:
            raise PluginError(f"a {point} plugin has an empty name")
        if name in seen:
            raise PluginError(f"two {point} plugins are named {name!r}; names must be unique")
        seen.add(name)


def _check_weight(name: str, weight: float) -> None:
    if not (math.isfinite(weight) and 0.0 < weight <= MAX_WEIGHT):
        raise PluginError(f"scorer {name!r}: weight {weight!r} must be > 0 and <= {MAX_WEIGHT:g}")


def _misfit(name: str, what: str) -> PluginError:
    # Only a filter can put something odd in a trace (a non-string reason...).
    return PluginError(
        f"filter plugin {name!r} returned data that does not fit the decision trace: {what}"
    )


def _account(name: str, result: FilterResult[C], offered: int) -> tuple[Sequence[C], FilterStep]:
    """A filter's survivors and its trace record, once its result is checked."""
    try:
        kept, removed = result.kept, result.removed
        counted = len(kept) + len(removed)
    except (AttributeError, TypeError):
        raise PluginError(
            f"filter plugin {name!r} returned {type(result).__name__}, not a FilterResult"
        ) from None
    if counted != offered:
        raise PluginError(
            f"filter plugin {name!r} kept {len(kept)} and removed {len(removed)} of {offered} "
            "candidates; every candidate must be either kept or removed with a reason"
        )
    if not removed:
        return kept, FilterStep(name, (), (), len(kept))
    ids, reasons = _removals(name, removed)
    return kept, FilterStep(name, ids, reasons, len(kept))


def _removals(
    name: str, removed: Sequence[tuple[str, str]]
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Removed ids and ``(id, reason)`` pairs, refusing anything but pairs of strings.

    A trace is not validated as a whole, so this is where a filter's odd output (a
    non-string reason, a triple...) is caught, with C-level passes over the removals.
    """
    try:
        shapes = set(map(type, removed))
        ids, whys = zip(*removed, strict=True)
    except (TypeError, ValueError):
        raise _misfit(name, f"removals must be (id, reason) pairs, got {removed!r}") from None
    kinds = set(map(type, ids))
    kinds.update(map(type, whys))
    if not shapes <= _PAIR_TYPES or (kinds != _STR and not all(issubclass(k, str) for k in kinds)):
        raise _misfit(name, f"removals must be (id, reason) string pairs, got {removed!r}")
    if shapes == _TUPLE and type(removed) is tuple:
        return ids, removed
    return ids, tuple(zip(ids, whys, strict=True))  # the record is immutable: no lists


class Profile(Generic[C, X]):
    """One tier's routing profile: ``run(request, candidates, ctx) -> Decision``.

    ``metrics`` (built once per registry, see :mod:`gtm.routing.metrics`) turns on the
    decision and per-plugin latency histograms; ``timer`` is what measures them
    (injectable for tests). Plugin latency is measured on the first decision and then one
    in ``plugin_timing_every`` (1: every decision; see :data:`DEFAULT_PLUGIN_TIMING_EVERY`).
    ``cost_model``, when given, prices the choice as ``Decision.predicted_ttft_ms``.
    ``trace_scores`` keeps only the N best survivors' scores (and the choice's) in the
    trace; building the per-candidate score records is most of a decision's cost over
    thousands of candidates, and nobody reads 10,000 of them. ``None`` traces them all.
    """

    def __init__(
        self,
        name: str,
        tier: Tier,
        filters: Sequence[Filter[C, X]],
        scorers: Sequence[WeightedScorer[C, X]],
        picker: Picker[C],
        *,
        cost_model: CostModel[C, X] | None = None,
        metrics: RoutingMetrics | None = None,
        timer: Callable[[], float] = time.perf_counter,
        trace_scores: int | None = None,
        plugin_timing_every: int = DEFAULT_PLUGIN_TIMING_EVERY,
    ) -> None:
        if trace_scores is not None and trace_scores < 0:
            raise ConfigError(f"profile {name!r}: trace_scores must be >= 0 or None")
        if plugin_timing_every < 1:
            raise ConfigError(f"profile {name!r}: plugin_timing_every must be >= 1")
        if not name:
            raise PluginError("a profile needs a name")
        if picker is None:
            raise PluginError(f"profile {name!r}: a profile has exactly one picker, got none")
        _unique_names(ExtensionPoint.FILTER, [f.name for f in filters])
        _unique_names(ExtensionPoint.SCORER, [ws.scorer.name for ws in scorers])
        for ws in scorers:
            _check_weight(ws.scorer.name, ws.weight)
        self._name = name
        self._tier = tier
        self._filters = tuple(filters)
        self._filter_names = tuple(f.name for f in self._filters)
        self._scorers = tuple(ws.scorer for ws in scorers)
        self._scorer_names = tuple(s.name for s in self._scorers)
        self._weights = tuple(float(ws.weight) for ws in scorers)
        self._weights_trace = tuple(zip(self._scorer_names, self._weights, strict=True))
        # Summed in the same order as the numerators in _totals (see module docstring).
        self._weight_sum = 0.0
        for weight in self._weights:
            self._weight_sum += weight
        self._picker = picker
        self._picker_name = picker.name
        self._cost_model = cost_model
        self._metrics = metrics
        self._timer = timer
        self._trace_scores = trace_scores
        self._timing_every = plugin_timing_every
        # A per-profile decision counter for the timing sample; next() on a count is
        # atomic under the GIL, so concurrent callers at worst share a sample.
        self._decisions = itertools.count()
        self._bind_observers(metrics)

    def _bind_observers(self, metrics: RoutingMetrics | None) -> None:
        def observer(point: ExtensionPoint, plugin: str) -> _Observe:
            if metrics is None:
                return _ignore
            return metrics.plugin_duration.labels(self._tier, point, plugin).observe

        self._filter_obs = tuple(observer(ExtensionPoint.FILTER, n) for n in self._filter_names)
        self._scorer_obs = tuple(observer(ExtensionPoint.SCORER, n) for n in self._scorer_names)
        self._picker_obs = observer(ExtensionPoint.PICKER, self._picker_name)
        cost_name = self._cost_model.name if self._cost_model is not None else ""
        self._cost_obs = observer(ExtensionPoint.COST_MODEL, cost_name)
        self._decision_obs: _Observe | None = (
            None
            if metrics is None
            else metrics.decision_duration.labels(self._tier, self._name).observe
        )

    # ------------------------------------------------------------------ introspection

    @property
    def name(self) -> str:
        return self._name

    @property
    def tier(self) -> Tier:
        return self._tier

    @property
    def filter_names(self) -> tuple[str, ...]:
        return self._filter_names

    @property
    def scorer_weights(self) -> tuple[tuple[str, float], ...]:
        return self._weights_trace

    @property
    def picker_name(self) -> str:
        return self._picker_name

    @property
    def cost_model_name(self) -> str | None:
        return None if self._cost_model is None else self._cost_model.name

    @property
    def plugin_timing_every(self) -> int:
        return self._timing_every

    # ------------------------------------------------------------------ decisions

    def run(self, request: RouteRequest, candidates: Sequence[C], ctx: X) -> Decision:
        """Decide for ``request`` among ``candidates`` over the snapshot ``ctx``.

        Raises:
            NoEligibleCandidate: the filters removed every candidate (``filter_name`` says
                which one; ``trace`` holds who removed what up to there).
            PluginError: a plugin raised or broke its contract (named in the message).
            RoutingError: the candidate ids are not unique.
        """
        return self.choose(request, candidates, ctx).decision

    def choose(self, request: RouteRequest, candidates: Sequence[C], ctx: X) -> Choice[C]:
        """Like :meth:`run`, and also returns the chosen candidate object."""
        observe = self._decision_obs
        started = 0.0 if observe is None else self._timer()
        timed = observe is not None and next(self._decisions) % self._timing_every == 0
        offered = tuple(map(_candidate_id, candidates))
        if len(set(offered)) != len(offered):
            raise RoutingError(f"profile {self._name!r}: candidate ids are not unique")
        steps: list[FilterStep] = []
        survivors = self._filter(request, candidates, ctx, offered, steps, timed)
        ids = list(map(_candidate_id, survivors))
        issues: list[ScoreIssue] = []
        columns = self._score(request, survivors, ids, ctx, issues, timed)
        totals = self._totals(columns, len(ids))
        choice = self._pick(request, survivors, totals, ids, timed)
        traced = self._traced(totals, ids, choice.id)
        trace = DecisionTrace(
            profile=self._name,
            candidates=offered,
            filters=tuple(steps),
            scores=self._score_records(ids, columns, totals, traced),
            picker=self._picker_name,
            weights=self._weights_trace,
            score_issues=tuple(issues),
            scores_omitted=0 if traced is None else len(ids) - len(traced),
        )
        decision = Decision(
            request_id=request.request_id,
            tier=self._tier,
            choice=choice.id,
            trace=trace,
            predicted_ttft_ms=self._predict(request, choice, ctx, timed),
        )
        if observe is not None:
            observe(self._timer() - started)
        return Choice(choice, decision)

    # ------------------------------------------------------------------ filter

    def _filter(
        self,
        request: RouteRequest,
        candidates: Sequence[C],
        ctx: X,
        offered: tuple[str, ...],
        steps: list[FilterStep],
        timed: bool,
    ) -> Sequence[C]:
        if not candidates:
            self._refuse(NO_CANDIDATES_OFFERED, "no candidates offered", offered, steps)
        current = candidates
        timer = self._timer
        for index, plugin in enumerate(self._filters):
            name = self._filter_names[index]
            start = timer() if timed else 0.0
            try:
                result = plugin.filter(request, current, ctx)
            except GtmError:
                raise
            except Exception as exc:
                raise _plugin_failed(ExtensionPoint.FILTER, name, exc) from exc
            if timed:
                self._filter_obs[index](timer() - start)
            kept, step = _account(name, result, len(current))
            steps.append(step)
            if not kept:
                cid, reason = step.reasons[0]
                why = f"removed all {len(step.removed)}, e.g. {cid!r}: {reason}"
                self._refuse(name, why, offered, steps)
            current = kept
        return current

    def _refuse(
        self, filter_name: str, why: str, offered: tuple[str, ...], steps: list[FilterStep]
    ) -> None:
        if self._metrics is not None:
            self._metrics.no_eligible.labels(self._tier, self._name, filter_name).inc()
        trace = DecisionTrace(
            profile=self._name,
            candidates=offered,
            filters=tuple(steps),
            picker=self._picker_name,
            weights=self._weights_trace,
        )
        raise NoEligibleCandidate(filter_name, why, trace=trace)

    # ------------------------------------------------------------------ score

    def _score(
        self,
        request: RouteRequest,
        survivors: Sequence[C],
        ids: list[str],
        ctx: X,
        issues: list[ScoreIssue],
        timed: bool,
    ) -> list[list[float]]:
        columns: list[list[float]] = []
        timer = self._timer
        for index, plugin in enumerate(self._scorers):
            name = self._scorer_names[index]
            start = timer() if timed else 0.0
            try:
                raw = plugin.score(request, survivors, ctx)
            except GtmError:
                raise
            except Exception as exc:
                raise _plugin_failed(ExtensionPoint.SCORER, name, exc) from exc
            if timed:
                self._scorer_obs[index](timer() - start)
            columns.append(self._column(name, raw, ids, issues))
        return columns

    def _column(
        self, name: str, raw: Mapping[str, float], ids: list[str], issues: list[ScoreIssue]
    ) -> list[float]:
        """The scorer's values in candidate order; the slow path only on a broken contract."""
        try:
            # A scorer usually returns its dict in candidate order, holding nothing else:
            # then its values are the column, without a lookup per candidate.
            column = list(raw.values()) if list(raw) == ids else list(map(raw.__getitem__, ids))
            # sum() is a float or an int only when every value is one, and it is NaN when
            # any value is NaN; without NaN, min() and max() are exact.
            checksum = sum(column)
            if (
                type(checksum) in _PLAIN_NUMBERS
                and checksum == checksum
                and min(column) >= 0.0
                and max(column) <= 1.0
            ):
                return column
        except (KeyError, TypeError, AttributeError):
            pass
        return self._repair(name, raw, ids, issues)

    def _repair(
        self, name: str, raw: Mapping[str, float], ids: list[str], issues: list[ScoreIssue]
    ) -> list[float]:
        if not isinstance(raw, Mapping):
            raise PluginError(
                f"scorer plugin {name!r} returned {type(raw).__name__}, "
                "not a mapping of candidate id to score"
            )
        column: list[float] = []
        found: list[ScoreIssue] = []
        for cid in ids:
            value, kind = _clamp(name, cid, raw.get(cid))
            if kind is not None:
                found.append(ScoreIssue(plugin=name, candidate=cid, kind=kind))
            column.append(value)
        if self._metrics is not None:
            for kind, count in Counter(issue.kind for issue in found).items():
                self._metrics.score_issues.labels(self._tier, name, kind).inc(count)
        issues.extend(found)
        return column

    def _totals(self, columns: list[list[float]], n: int) -> list[float]:
        """``Σ wᵢ·sᵢ / Σ wᵢ`` per candidate, summed in the order of ``_weight_sum``."""
        ws = self._weight_sum
        if len(columns) == 3:  # the usual profile shape: one comprehension, no temporaries
            (w0, w1, w2), (c0, c1, c2) = self._weights, columns
            return [(w0 * a + w1 * b + w2 * c) / ws for a, b, c in zip(c0, c1, c2, strict=True)]
        if not columns:
            return [0.0] * n
        totals = [0.0] * n
        for weight, column in zip(self._weights, columns, strict=True):
            totals = [t + weight * s for t, s in zip(totals, column, strict=True)]
        return [t / ws for t in totals]

    def _traced(self, totals: list[float], ids: list[str], choice: str) -> list[int] | None:
        """Indices of the survivors whose scores go in the trace (None: all of them)."""
        limit = self._trace_scores
        if limit is None or limit >= len(totals):
            return None
        chosen = ids.index(choice)
        best = heapq.nlargest(limit, range(len(totals)), key=totals.__getitem__)
        if chosen not in best:
            best.append(chosen)
        return sorted(best)

    def _score_records(
        self,
        ids: list[str],
        columns: list[list[float]],
        totals: list[float],
        traced: list[int] | None,
    ) -> tuple[CandidateScore, ...]:
        if traced is not None:
            ids = [ids[i] for i in traced]
            columns = [[column[i] for i in traced] for column in columns]
            totals = [totals[i] for i in traced]
        if columns:
            # Row i is ((scorer, score of candidate i), ...) for every scorer, built in C.
            pairs = [
                zip(repeat(name), column)
                for name, column in zip(self._scorer_names, columns, strict=True)
            ]
            rows: list[tuple[tuple[str, float], ...]] = list(zip(*pairs, strict=True))
        else:
            rows = [()] * len(ids)
        return CandidateScore.batch(ids, rows, totals)

    # ------------------------------------------------------------------ pick and price

    def _pick(
        self,
        request: RouteRequest,
        survivors: Sequence[C],
        totals: list[float],
        ids: list[str],
        timed: bool,
    ) -> C:
        scored = cast(
            "list[Scored[C]]",
            list(map(_new_tuple, repeat(Scored), zip(survivors, totals, strict=True))),
        )
        start = self._timer() if timed else 0.0
        try:
            choice = self._picker.pick(request, scored)
        except GtmError:
            raise
        except Exception as exc:
            raise _plugin_failed(ExtensionPoint.PICKER, self._picker_name, exc) from exc
        if timed:
            self._picker_obs(self._timer() - start)
        if getattr(choice, "id", None) not in ids:
            raise PluginError(
                f"picker plugin {self._picker_name!r} returned {choice!r}, "
                "which is not one of the candidates that survived the filters"
            )
        return choice

    def _predict(self, request: RouteRequest, choice: C, ctx: X, timed: bool) -> float | None:
        model = self._cost_model
        if model is None:
            return None
        start = self._timer() if timed else 0.0
        try:
            cost = float(model.cost_ms(request, choice, ctx))
        except GtmError:
            raise
        except Exception as exc:
            raise _plugin_failed(ExtensionPoint.COST_MODEL, model.name, exc) from exc
        if timed:
            self._cost_obs(self._timer() - start)
        # An infinite cost (nothing serves there) or a negative one is no prediction.
        return cost if math.isfinite(cost) and cost >= 0.0 else None


def _clamp(scorer: str, cid: str, value: object) -> tuple[float, ScoreIssueKind | None]:
    """Repair one score: missing/NaN → 0, below 0 → 0, above 1 → 1; non-numbers are bugs."""
    if value is None:
        return 0.0, ScoreIssueKind.MISSING
    if not isinstance(value, int | float):
        raise PluginError(f"scorer plugin {scorer!r}: score of {cid!r} is {value!r}, not a number")
    number = float(value)
    if math.isnan(number):
        return 0.0, ScoreIssueKind.NAN
    if number < 0.0:
        return 0.0, ScoreIssueKind.BELOW
    if number > 1.0:
        return 1.0, ScoreIssueKind.ABOVE
    return number, None


# ------------------------------------------------------------ old pickers/max_score.py
MAX_SCORE_TYPE = "max-score-picker"

_total = attrgetter("total")


class MaxScoreParams(Frozen):
    """No parameters."""


class MaxScorePicker(Generic[C]):
    """Highest total wins; ties broken by the smallest id."""

    def __init__(self, name: str = MAX_SCORE_TYPE, params: MaxScoreParams | None = None) -> None:
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


# ------------------------------------------------------------ old pickers/power_of_two.py
POWER_OF_TWO_TYPE = "power-of-two-picker"


class PowerOfTwoParams(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class PowerOfTwoPicker(Generic[C]):
    """Better of two distinct random survivors."""

    def __init__(
        self,
        name: str = POWER_OF_TWO_TYPE,
        params: PowerOfTwoParams | None = None,
        *,
        rng_for: RngFactory = request_rng,
    ) -> None:
        self._name = name
        self._seed = (params or PowerOfTwoParams()).seed
        self._rng_for = rng_for

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: RouteRequest, scored: Sequence[Scored[C]], /) -> C:
        n = len(scored)
        if n == 0:
            raise PluginError(f"picker {self._name!r} was given no candidates")
        if n == 1:
            return scored[0].candidate
        rng = self._rng_for(request, self._seed)
        first = uniform_index(rng, n)
        # Draw the second from the other n - 1 so the two are always distinct.
        second = uniform_index(rng, n - 1)
        if second >= first:
            second += 1
        return better(scored[first], scored[second]).candidate


# ------------------------------------------------------------ old pickers/random_pick.py
RANDOM_TYPE = "random-picker"
#: llm-d's configuration name for this picker, kept as a deprecated alias.
RANDOM_ALIASES = ("random",)


class RandomParams(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class RandomPicker(Generic[C]):
    """Uniform over the survivors."""

    def __init__(
        self,
        name: str = RANDOM_TYPE,
        params: RandomParams | None = None,
        *,
        rng_for: RngFactory = request_rng,
    ) -> None:
        self._name = name
        self._seed = (params or RandomParams()).seed
        self._rng_for = rng_for

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: RouteRequest, scored: Sequence[Scored[C]], /) -> C:
        if not scored:
            raise PluginError(f"picker {self._name!r} was given no candidates")
        rng = self._rng_for(request, self._seed)
        return scored[uniform_index(rng, len(scored))].candidate


# ------------------------------------------------------------ old pickers/weighted_random.py
WEIGHTED_RANDOM_TYPE = "weighted-random-picker"


class WeightedRandomParams(Frozen):
    #: Mixed into every request's random source; change it to reshuffle all choices.
    seed: int = 0


class WeightedRandomPicker(Generic[C]):
    """P(candidate) = total / Σ totals."""

    def __init__(
        self,
        name: str = WEIGHTED_RANDOM_TYPE,
        params: WeightedRandomParams | None = None,
        *,
        rng_for: RngFactory = request_rng,
    ) -> None:
        self._name = name
        self._seed = (params or WeightedRandomParams()).seed
        self._rng_for = rng_for

    @property
    def name(self) -> str:
        return self._name

    def pick(self, request: RouteRequest, scored: Sequence[Scored[C]], /) -> C:
        if not scored:
            raise PluginError(f"picker {self._name!r} was given no candidates")
        rng = self._rng_for(request, self._seed)
        mass = sum(s.total for s in scored)
        if mass <= 0.0:
            return scored[uniform_index(rng, len(scored))].candidate
        target = rng.random() * mass
        cumulative = 0.0
        last_positive = scored[0]
        for entry in scored:
            if entry.total > 0.0:
                cumulative += entry.total
                last_positive = entry
                if target < cumulative:
                    return entry.candidate
        # Rounding can leave target a hair above the running sum: the last positive one.
        return last_positive.candidate


# ------------------------------------------------------------ old filters/allow_list.py
ALLOW_LIST_TYPE = "allow-list-filter"

_NOT_LISTED = "not in the allow list of filter {name!r}"
_NOT_ALLOWED = "not allowed for this request by the snapshot"


@runtime_checkable
class AllowListSource(Protocol):
    """A context that knows, per request, which candidate ids are allowed."""

    def allowed_ids(self, request: RouteRequest, /) -> Set[str] | None: ...


class AllowListParams(Frozen):
    ids: frozenset[str] | None = Field(default=None, max_length=100_000)
    from_context: bool = False

    @model_validator(mode="after")
    def _has_a_source(self) -> AllowListParams:
        if self.ids is None and not self.from_context:
            raise ValueError("set ids, from_context: true, or both")
        return self


class AllowListFilter(Generic[C]):
    """Removes every candidate whose id is not allowed."""

    def __init__(self, name: str, params: AllowListParams) -> None:
        self._name = name
        self._ids = params.ids
        self._from_context = params.from_context

    @property
    def name(self) -> str:
        return self._name

    def filter(
        self, request: RouteRequest, candidates: Sequence[C], ctx: object, /
    ) -> FilterResult[C]:
        static = self._ids
        dynamic = self._context_ids(request, ctx)
        # Comprehensions, one per source: this runs for every request over every candidate.
        kept = candidates if static is None else [c for c in candidates if c.id in static]
        if dynamic is not None:
            kept = [c for c in kept if c.id in dynamic]
        if len(kept) == len(candidates):
            return FilterResult(tuple(candidates))
        return FilterResult(tuple(kept), self._removals(candidates, static, dynamic))

    def _removals(
        self, candidates: Sequence[C], static: Set[str] | None, dynamic: Set[str] | None
    ) -> tuple[tuple[str, str], ...]:
        """``(id, why)`` for each removed candidate, in input order; static reasons first."""
        not_listed = _NOT_LISTED.format(name=self._name)
        if static is None and dynamic is not None:
            return tuple([(c.id, _NOT_ALLOWED) for c in candidates if c.id not in dynamic])
        if dynamic is None and static is not None:
            return tuple([(c.id, not_listed) for c in candidates if c.id not in static])
        removed: list[tuple[str, str]] = []
        for candidate in candidates:
            cid = candidate.id
            if static is not None and cid not in static:
                removed.append((cid, not_listed))
            elif dynamic is not None and cid not in dynamic:
                removed.append((cid, _NOT_ALLOWED))
        return tuple(removed)

    def _context_ids(self, request: RouteRequest, ctx: object) -> Set[str] | None:
        if not self._from_context:
            return None
        # The same attribute test isinstance(ctx, AllowListSource) makes, without the
        # protocol machinery that costs ~20 µs per call on Python 3.11.
        allowed_ids = getattr(ctx, "allowed_ids", None)
        if not callable(allowed_ids):
            raise PluginError(
                f"filter {self._name!r} has from_context: true, but the context "
                f"{type(ctx).__name__} has no allowed_ids(request) method"
            )
        result: Set[str] | None = allowed_ids(request)
        return result

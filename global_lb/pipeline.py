"""Region choice over precomputed arrays: the global profile's fast path.

The generic :class:`gtm.routing.Profile` passes region objects and ``{id: score}`` dicts
between plugins and builds a full trace on every decision: ~100 µs over 50 regions on
the 2-core CI machine, twice the global tier's 50 µs p99 budget (issue 7). A decision
reads few things that depend on the request (allowed set, client point, model, prompt
size, request id), so this module precomputes the rest once per :class:`GlobalView`
(a view lives about a second) and runs the same filter → score → pick contracts over
plain lists:

* **per view**: region ids, an availability bit mask (health filter), and per model the
  serves mask (model filter), the queueing delay and per-token prefill time (TTFT
  cost terms) and the headroom (load scorer, spread picker);
* **per allowed set** (the residency verdict, a handful per view): its bit mask;
* **per survivor mask**: the survivors' positions;
* **per client point**: the RTT vector (the view's latency model memoises it).

A decision is then ``allowed & available & serves`` → one pass computing costs, scores
and totals → best (ties to the smallest id) → the spread picker's draw when it spreads.

**Same semantics, checked.** Every number comes from the plugins' own modules (the
TTFT cost and fused total from :mod:`global_lb.plugins.ttft`, the spread picker's test
and draw from :mod:`global_lb.plugins.spread`), so the choice, the fallbacks and their
order are those of the profile: ``tests/property/test_global_fast_path.py`` runs both
on random views and requests. Only profiles made of the global tier's own plugin types
(and ``max-score-picker``) compile; :func:`compile_pipeline` returns ``None`` for any
other, and the router runs the generic profile. A decision whose filters leave nothing
is also left to the profile (rare, and its refusal names the filter and the reason),
as is every trace (:class:`global_lb.router.TraceSource` runs the profile on demand).
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from global_lb.plugins import affinity, health, load, model, residency, spread, ttft
from global_lb.view import ANY_MODEL, GlobalView, RegionState
from gtm.models import GeoPoint, RouteRequest
from gtm.routing import ProfileSpec

#: The generic picker the fast path also knows (``gtm.routing.pickers.max_score``).
MAX_SCORE_PICKER = "max-score-picker"
#: Survivor masks and allowed sets remembered per view; a view lives about a second and
#: sees a handful of each, so the bound only stops a pathological policy from growing it.
_MEMO_SIZE = 4096


class Ranking:
    """The survivors, best first, with their totals and the fallbacks after a choice:
    worked out when first read.

    A decision needs only its region; the front door reads the fallbacks only when a
    forward fails and the scores only for ``POST /v1/route`` and ``gtm route``. Ordering
    50 regions and pairing their ids with their totals was a third of a cold decision
    (~15 µs of CPU and 50 tuples per decision for the collector, bench/global_decision.py),
    so a decision keeps the survivors' ids and totals and this orders them on demand,
    once (outcomes served from the decision cache share it).
    """

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


def ranked_order(
    names: tuple[str, ...], totals: Sequence[float], ascending: bool = False
) -> list[int]:
    """Indices into ``names`` by total descending, then id ascending (``ascending``:
    the caller knows ``names`` are in id order)."""
    indices = range(len(totals))
    if ascending or all(a < b for a, b in itertools.pairwise(names)):
        return sorted(indices, key=totals.__getitem__, reverse=True)  # stable: ids stay in order
    return sorted(indices, key=lambda k: (-totals[k], names[k]))


class FastChoice(NamedTuple):
    """A decision of the fast path (a NamedTuple: built in C)."""

    region: RegionState
    #: The survivors' scores and the fallbacks, worked out when read.
    ranking: Ranking
    #: The cost model's price of the choice (``None``: no cost model, or not finite).
    predicted_ttft_ms: float | None
    #: The spread picker drew at random (the best region is near saturation or the
    #: client was displaced): decisions differ per request id.
    spread: bool = False
    #: Set when the choice does not depend on the prompt size: every survivor has this
    #: per-token prefill time, so a prompt adds the same to each cost and the TTFT
    #: scores (cost differences) stay. The predicted TTFT for ``tokens`` is then
    #: ``ttft.with_prompt(fixed, per_token, tokens)``.
    per_token: float | None = None
    #: The chosen region's prompt-independent cost (with :attr:`per_token`).
    fixed: float = 0.0

    @property
    def scores(self) -> tuple[tuple[str, float], ...]:
        """(region id, total score) of the survivors, best first (ties: smaller id first)."""
        return self.ranking.scores

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """The other survivors in that order."""
        return self.ranking.fallbacks


# ---------------------------------------------------------------------------- per view


@dataclass(frozen=True, slots=True)
class ModelColumns:
    """Per-region numbers of one model, in view order."""

    #: Bit i set: region i passes the model filter.
    serves: int
    #: Cost = (rtt + base) + tokens × per_token (base ∞ where the model is not served).
    base: tuple[float, ...]
    per_token: tuple[float, ...]
    headroom: tuple[float, ...]


class _Entry(NamedTuple):
    """One region's numbers in :class:`ModelColumns`."""

    serves: bool
    base: float
    per_token: float
    headroom: float


def _entry(region: RegionState, model_name: str) -> _Entry:
    terms = region.terms.get(model_name)
    serves = (
        region.summary is None or model_name == ANY_MODEL or (terms is not None and terms.serves)
    )
    return _Entry(serves, *ttft.cost_terms(region, model_name), region.headroom(model_name))


def model_columns(regions: Sequence[RegionState], model_name: str) -> ModelColumns:
    entries = [_entry(region, model_name) for region in regions]
    serves = 0
    for i, entry in enumerate(entries):
        if entry.serves:
            serves |= 1 << i
    return ModelColumns(
        serves,
        tuple([e.base for e in entries]),
        tuple([e.per_token for e in entries]),
        tuple([e.headroom for e in entries]),
    )


def patched_columns(
    columns: ModelColumns, regions: Sequence[RegionState], model_name: str, changed: list[int]
) -> ModelColumns:
    """``columns`` with the regions at ``changed`` positions worked out again."""
    serves = columns.serves
    base, per_token = list(columns.base), list(columns.per_token)
    headroom = list(columns.headroom)
    for i in changed:
        entry = _entry(regions[i], model_name)
        serves = serves | 1 << i if entry.serves else serves & ~(1 << i)
        base[i], per_token[i], headroom[i] = entry.base, entry.per_token, entry.headroom
    return ModelColumns(serves, tuple(base), tuple(per_token), tuple(headroom))


@dataclass(slots=True)
class Prepared:
    """What a view's decisions share; built on the view's first decision."""

    view: GlobalView
    ids: tuple[str, ...]
    available: int
    #: The view lists regions in id order (``build_view`` does): a stable sort on the
    #: total alone then breaks ties by id.
    id_ordered: bool
    models: dict[str, ModelColumns] = field(default_factory=dict)
    allowed: dict[frozenset[str], int] = field(default_factory=dict)
    survivors: dict[int, tuple[int, ...]] = field(default_factory=dict)
    survivor_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)
    homes: dict[tuple[str, str, int], int | None] = field(default_factory=dict)
    rows: dict[tuple[float, float, str | None, str, int], Rows] = field(default_factory=dict)
    subsets: dict[tuple[str, int], Subset] = field(default_factory=dict)
    #: The previous view's (an overlay of the same regions: the in-flight ledger's) and
    #: the positions whose regions differ from it (bit mask). Its per-model columns are
    #: patched rather than rebuilt, and its per-mask memos carry over for masks clear of
    #: the changed positions (clients' rows included). One level: the previous view's
    #: own parent is dropped.
    parent: Prepared | None = None
    changed: int = 0

    @classmethod
    def of(cls, view: GlobalView, previous: Prepared | None = None) -> Prepared:
        """``view``'s, derived from ``previous`` when it has the same regions in the same
        places (the in-flight ledger's overlays of one base view: only a few regions'
        terms differ, and a new overlay comes every few tens of decisions)."""
        regions = view.regions
        ids = tuple(r.id for r in regions)
        if previous is not None and _same_places(previous, view, ids):
            return previous.derive(view)
        available = 0
        for i, region in enumerate(regions):
            if region.healthy and not region.drained:
                available |= 1 << i
        return cls(view, ids, available, list(ids) == sorted(ids))

    def derive(self, view: GlobalView) -> Prepared:
        """:meth:`of` ``view`` (same ids, places and latency model as this one's)."""
        changed = 0
        available = self.available
        for i, (old, new) in enumerate(zip(self.view.regions, view.regions, strict=True)):
            if old is not new:
                changed |= 1 << i
                if new.healthy and not new.drained:
                    available |= 1 << i
                else:
                    available &= ~(1 << i)
        self.parent = None  # one level is enough, and a chain would keep every view
        if changed == (1 << len(self.ids)) - 1:  # a new base view: nothing carries over
            return Prepared(view, self.ids, available, self.id_ordered, allowed=self.allowed,
                            survivors=self.survivors, survivor_ids=self.survivor_ids)  # fmt: skip
        # Shared: functions of the ids alone.
        return Prepared(
            view,
            self.ids,
            available,
            self.id_ordered,
            allowed=self.allowed,
            survivors=self.survivors,
            survivor_ids=self.survivor_ids,
            parent=self,
            changed=changed,
        )

    def columns(self, model_name: str) -> ModelColumns:
        found = self.models.get(model_name)
        if found is None:
            if len(self.models) >= _MEMO_SIZE:
                self.models.clear()
            parent = self.parent
            inherited = None if parent is None else parent.models.get(model_name)
            if inherited is None:
                found = model_columns(self.view.regions, model_name)
            else:
                changed = list(self.positions(self.changed))
                found = patched_columns(inherited, self.view.regions, model_name, changed)
            self.models[model_name] = found
        return found

    def inherited_subset(self, key: tuple[str, int]) -> Subset | None:
        parent = self.parent
        if parent is None or key[1] & self.changed:
            return None
        return parent.subsets.get(key)

    def inherited_rows(self, key: tuple[float, float, str | None, str, int]) -> Rows | None:
        parent = self.parent
        if parent is None or key[4] & self.changed:
            return None
        return parent.rows.get(key)

    def allowed_mask(self, allowed: frozenset[str]) -> int:
        found = self.allowed.get(allowed)
        if found is None:
            found = 0
            for i, rid in enumerate(self.ids):
                if rid in allowed:
                    found |= 1 << i
            if len(self.allowed) >= _MEMO_SIZE:
                self.allowed.clear()
            self.allowed[allowed] = found
        return found

    def subset(self, columns: ModelColumns, model_name: str, mask: int) -> Subset:
        """``columns`` of the regions in ``mask``, memoised per view."""
        key = (model_name, mask)
        found = self.subsets.get(key)
        if found is None:
            found = self.inherited_subset(key)
        if found is None:
            positions = self.positions(mask)
            pick = _picker_of(positions)
            per_token = pick(columns.per_token)
            uniform = per_token[0] if per_token.count(per_token[0]) == len(per_token) else None
            found = Subset(pick, pick(columns.base), per_token, pick(columns.headroom), uniform)
            if len(self.subsets) >= _MEMO_SIZE:
                self.subsets.clear()
            self.subsets[key] = found
        return found

    def names(self, mask: int) -> tuple[str, ...]:
        """The ids of :meth:`positions`."""
        found = self.survivor_ids.get(mask)
        if found is None:
            found = tuple(self.ids[i] for i in self.positions(mask))
            if len(self.survivor_ids) >= _MEMO_SIZE:
                self.survivor_ids.clear()
            self.survivor_ids[mask] = found
        return found

    def positions(self, mask: int) -> tuple[int, ...]:
        """The set bits of ``mask``, ascending (view order)."""
        found = self.survivors.get(mask)
        if found is None:
            found = tuple(i for i in range(len(self.ids)) if mask >> i & 1)
            if len(self.survivors) >= _MEMO_SIZE:
                self.survivors.clear()
            self.survivors[mask] = found
        return found


def _same_places(previous: Prepared, view: GlobalView, ids: tuple[str, ...]) -> bool:
    """Whether ``view``'s per-client numbers (RTTs) are ``previous``'s: same regions in
    the same order and places, same latency model."""
    old = previous.view
    return ids == previous.ids and view.latency is old.latency and view.signature == old.signature


def _picker_of(positions: tuple[int, ...]) -> Callable[[Sequence[float]], tuple[float, ...]]:
    """A gather of ``positions`` (``operator.itemgetter``: in C), always a tuple."""
    if len(positions) == 1:
        (only,) = positions
        return lambda values: (values[only],)
    return operator.itemgetter(*positions)


class Subset(NamedTuple):
    """A model's columns for the regions of one survivor mask (in position order)."""

    pick: Callable[[Sequence[float]], tuple[float, ...]]
    base: tuple[float, ...]
    per_token: tuple[float, ...]
    headroom: tuple[float, ...]
    #: See :attr:`Rows.uniform`.
    uniform: float | None


class Rows(NamedTuple):
    """The survivors' columns for one (client point, country, model, survivor mask),
    in position order: what a decision reads besides the prompt size."""

    #: ``rtt + base``: the prompt-independent part of the TTFT cost (ttft.fixed_column).
    fixed: tuple[float, ...]
    per_token: tuple[float, ...]
    headroom: tuple[float, ...]
    #: The smallest finite ``fixed`` (``None``: none is finite).
    low: float | None
    #: Every survivor's ``per_token`` when they are all equal (same GPUs everywhere),
    #: else ``None``: then the cheapest cost is ``low + tokens × uniform`` (rounding is
    #: monotonic, so adding one number to each keeps the smallest the smallest).
    uniform: float | None


def survivor_rows(
    prep: Prepared,
    columns: ModelColumns,
    model_name: str,
    mask: int,
    positions: tuple[int, ...],
    point: GeoPoint | None,
    country: str | None,
) -> Rows:
    """:class:`Rows`, memoised per view: clients repeat (cities, resolvers), and a
    repeat skips the RTT lookup and three gathers over the regions."""
    lat, lon = (point.lat, point.lon) if point is not None else (999.0, 999.0)
    key = (lat, lon, country, model_name, mask)
    found = prep.rows.get(key)
    if found is None and prep.parent is not None:
        found = prep.inherited_rows(key)
        if found is not None:
            prep.rows[key] = found
    if found is None:
        sub = prep.subset(columns, model_name, mask)
        view = prep.view
        rtts = view.latency.row(view.signature, view.regions, point, country, positions)
        fixed = ttft.fixed_column(rtts, sub.base)
        low = ttft.lowest(fixed)
        found = Rows(fixed, sub.per_token, sub.headroom, low, sub.uniform)
        if len(prep.rows) >= _ROWS_MEMO_SIZE:
            prep.rows.clear()
        prep.rows[key] = found
    return found


#: Client rows remembered per view (a view lives about a second; 50 regions × 3 floats
#: a row, so the bound is a few tens of MB at most).
_ROWS_MEMO_SIZE = 65_536


# ---------------------------------------------------------------------------- compiling


class _Scorer(NamedTuple):
    kind: str  # a plugin type name
    weight: float
    #: ttft: its score scale (ms); unused otherwise.
    scale: float = 0.0
    home: affinity.TenantAffinityScorer | None = None


@dataclass(frozen=True, slots=True)
class _Filters:
    health: bool
    model: bool


def _filters(spec: ProfileSpec, types: Mapping[str, str]) -> _Filters | None:
    kinds = {types.get(ref) for ref in spec.profile.filters}
    if not kinds <= {residency.TYPE_NAME, health.TYPE_NAME, model.TYPE_NAME}:
        return None
    if residency.TYPE_NAME not in kinds:
        return None  # profiles.require_residency refuses such a profile anyway
    return _Filters(health.TYPE_NAME in kinds, model.TYPE_NAME in kinds)


def _scorers(spec: ProfileSpec) -> tuple[_Scorer, ...] | None:
    plugins = {p.plugin_name: p for p in spec.plugins}
    out: list[_Scorer] = []
    for ref in spec.profile.scorers:
        plugin = plugins.get(ref.ref)
        if plugin is None:
            return None
        params = dict(plugin.parameters)
        weight = float(ref.weight)
        if plugin.type in (ttft.TYPE_NAME, ttft.COST_MODEL_TYPE_NAME):
            scale = ttft.Params.model_validate(params).scale_ms
            out.append(_Scorer(ttft.TYPE_NAME, weight, scale))
        elif plugin.type == load.TYPE_NAME:
            out.append(_Scorer(load.TYPE_NAME, weight))
        elif plugin.type == affinity.TYPE_NAME:
            scorer = affinity.TenantAffinityScorer(ref.ref, affinity.Params.model_validate(params))
            out.append(_Scorer(affinity.TYPE_NAME, weight, home=scorer))
        else:
            return None
    return tuple(out)


def _picker(spec: ProfileSpec) -> tuple[bool, spread.HeadroomSpreadPicker | None]:
    """(known, the spread picker): ``(True, None)`` is max-score."""
    name = spec.profile.picker
    for plugin in spec.plugins:
        if plugin.plugin_name == name:
            if plugin.type == spread.TYPE_NAME:
                params = spread.Params.model_validate(dict(plugin.parameters))
                return True, spread.HeadroomSpreadPicker(name, params)
            if plugin.type == MAX_SCORE_PICKER:
                return True, None
    return False, None


def _has_cost_model(spec: ProfileSpec) -> bool | None:
    """Whether the profile prices its choice; ``None`` when the cost model is unknown."""
    ref = spec.profile.cost_model
    if ref is None:
        return False
    kinds = {p.plugin_name: p.type for p in spec.plugins}
    return True if kinds.get(ref) in (ttft.TYPE_NAME, ttft.COST_MODEL_TYPE_NAME) else None


def compile_pipeline(spec: ProfileSpec) -> RegionPipeline | None:
    """The fast path for ``spec``, or ``None`` when it uses a plugin the fast path does not
    know (or ``trace_scores``, which trims fallbacks to the traced regions)."""
    types = {p.plugin_name: p.type for p in spec.plugins}
    filters = _filters(spec, types)
    scorers = _scorers(spec)
    known, spreader = _picker(spec)
    priced = _has_cost_model(spec)
    if filters is None or scorers is None or not known or priced is None:
        return None
    if spec.trace_scores is not None:
        return None
    return RegionPipeline(filters, scorers, spreader, priced=priced)


# ---------------------------------------------------------------------------- deciding


class RegionPipeline:
    """Decides like the profile it was compiled from, over :class:`Prepared` views."""

    def __init__(
        self,
        filters: _Filters,
        scorers: tuple[_Scorer, ...],
        spreader: spread.HeadroomSpreadPicker | None,
        *,
        priced: bool,
    ) -> None:
        self._filters = filters
        self._scorers = scorers
        self._weight_sum = 0.0
        for scorer in scorers:  # summed in order, like Profile._weight_sum
            self._weight_sum += scorer.weight
        self._spread = spreader
        #: (ttft weight, load weight, Σw) and the ttft scale when the scorers are exactly
        #: those two (ttft.fused_totals).
        self._ttft_load: tuple[tuple[float, float, float], float] | None = None
        if tuple(sc.kind for sc in scorers) == (ttft.TYPE_NAME, load.TYPE_NAME):
            weights = (scorers[0].weight, scorers[1].weight, self._weight_sum)
            self._ttft_load = (weights, scorers[0].scale)
        self._priced = priced
        self._prepared: Prepared | None = None

    def prepared(self, view: GlobalView) -> Prepared:
        found = self._prepared
        if found is None or found.view is not view:
            found = self._prepared = Prepared.of(view, found)
        return found

    def decide(
        self,
        request: RouteRequest,
        view: GlobalView,
        allowed: frozenset[str],
        point: GeoPoint | None,
        country: str | None,
    ) -> FastChoice | None:
        """The profile's choice, or ``None`` when the filters leave no region."""
        prep = self.prepared(view)
        mask = prep.allowed_mask(allowed)
        if self._filters.health:
            mask &= prep.available
        columns = prep.columns(request.model)
        if self._filters.model:
            mask &= columns.serves
        if not mask:
            return None
        positions = prep.positions(mask)
        names = prep.names(mask)
        totals, costs, top = self._totals(request, prep, columns, mask, positions, point, country)
        # The picker's best: highest total, ties to the smallest id (gtm.routing.better).
        # One pass, not a sort: the order is worked out only when read (Ranking).
        if prep.id_ordered:  # the first of equal maxima is the smallest id
            k = totals.index(max(totals)) if top is None else top
        else:
            k = min(range(len(totals)), key=lambda i: (-totals[i], names[i]))
        best = k
        spreader = self._spread
        spreads = spreader is not None and spreader.spreads_at(
            request, view.regions[positions[k]], columns.headroom[positions[k]]
        )
        order = None
        if spreads:
            assert spreader is not None
            # The draw's pool is the head of the ranking: order it (a sort keyed in C,
            # cheaper than a partial selection keyed in Python) and keep the order.
            order = ranked_order(names, totals, prep.id_ordered)
            headroom = prep.subset(columns, request.model, mask).headroom
            k = spreader.draw(request, order, totals, k, headroom)
        ranking = Ranking(names, totals, best, k, order)
        chosen = positions[k]
        predicted = None
        if self._priced:
            if costs:
                cost = costs[k]
            else:
                rows = survivor_rows(prep, columns, request.model, mask, positions, point, country)
                cost = ttft.with_prompt(rows.fixed[k], rows.per_token[k], request.input_tokens)
            predicted = ttft.prediction(cost)
        if isinstance(costs, ttft.ShiftedCosts):
            region = view.regions[chosen]
            return FastChoice(region, ranking, predicted, spreads, costs.per_token, costs.fixed(k))
        return FastChoice(view.regions[chosen], ranking, predicted, spreads)

    # ------------------------------------------------------------------ scores

    def _totals(
        self,
        request: RouteRequest,
        prep: Prepared,
        columns: ModelColumns,
        mask: int,
        positions: tuple[int, ...],
        point: GeoPoint | None,
        country: str | None,
    ) -> tuple[list[float], Sequence[float], int | None]:
        """Each survivor's ``Σ wᵢ·sᵢ / Σ wᵢ``, its TTFT cost (when computed), and the
        index of the first highest total (when found on the way)."""
        if not self._scorers:
            return [0.0] * len(positions), [], None
        fused = self._ttft_load
        if fused is not None:
            rows = survivor_rows(prep, columns, request.model, mask, positions, point, country)
            weights, scale = fused
            return ttft.fused_totals(
                rows.fixed, rows.per_token, rows.uniform, rows.low, rows.headroom,
                request.input_tokens, weights, scale,
            )  # fmt: skip
        costs: Sequence[float] = ()
        sums: list[float] | None = None
        for scorer in self._scorers:
            if scorer.kind == ttft.TYPE_NAME:
                if not costs:
                    rows = survivor_rows(
                        prep, columns, request.model, mask, positions, point, country
                    )
                    costs = ttft.costs_column(rows.fixed, rows.per_token, request.input_tokens)
                column = ttft.scores_column(prep.names(mask), costs, scorer.scale)
            elif scorer.kind == load.TYPE_NAME:
                headroom = columns.headroom
                column = [headroom[i] for i in positions]
            else:
                column = _affinity(request, prep, mask, positions, scorer)
            w = scorer.weight
            if sums is None:
                sums = [w * s for s in column]
            else:
                sums = [t + w * s for t, s in zip(sums, column, strict=True)]
        assert sums is not None
        ws = self._weight_sum
        return [t / ws for t in sums], costs, None


def _affinity(
    request: RouteRequest, prep: Prepared, mask: int, positions: tuple[int, ...], scorer: _Scorer
) -> list[float]:
    """``tenant-affinity-scorer``: 1 for the key's home region, memoised per view."""
    plugin = scorer.home
    assert plugin is not None
    key = (plugin.key(request), request.model, mask)
    memo = prep.homes
    if key not in memo:
        regions = prep.view.regions
        home = plugin.home(request, [regions[i] for i in positions])
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[key] = None if home is None else prep.ids.index(home)
    home_at = memo[key]
    return [1.0 if i == home_at else 0.0 for i in positions]

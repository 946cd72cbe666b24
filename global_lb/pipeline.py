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

**Same semantics, checked.** Every number is computed with the plugins' own formulas,
in the same floating-point order (costs ``(rtt + queue) + tokens·ms_per_token``, totals
``Σ wᵢ·sᵢ / Σ wᵢ`` summed left to right), so the choice, the fallbacks and their order
are those of the profile: ``tests/property/test_global_fast_path.py`` runs both on
random views and requests. Only profiles made of the global tier's own plugin types
(and ``max-score-picker``) compile; :func:`compile_pipeline` returns ``None`` for any
other, and the router runs the generic profile. A decision whose filters leave nothing
is also left to the profile (rare, and its refusal names the filter and the reason),
as is every trace (:class:`global_lb.router.TraceSource` runs the profile on demand).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from global_lb.plugins import affinity, health, load, model, residency, spread, ttft
from global_lb.view import ANY_MODEL, GlobalView, RegionState
from gtm.models import GeoPoint, RouteRequest
from gtm.routing import ProfileSpec, request_rng

#: The generic picker the fast path also knows (``gtm.routing.pickers.max_score``).
MAX_SCORE_PICKER = "max-score-picker"
#: Survivor masks and allowed sets remembered per view; a view lives about a second and
#: sees a handful of each, so the bound only stops a pathological policy from growing it.
_MEMO_SIZE = 4096


class FastChoice(NamedTuple):
    """A decision of the fast path (a NamedTuple: built in C)."""

    region: RegionState
    #: (region id, total score) of the survivors, best first (ties: smaller id first).
    scores: tuple[tuple[str, float], ...]
    #: The other survivors in that order.
    fallbacks: tuple[str, ...]
    #: The cost model's price of the choice (``None``: no cost model, or not finite).
    predicted_ttft_ms: float | None
    #: The spread picker drew at random (the best region is near saturation or the
    #: client was displaced): decisions differ per request id.
    spread: bool = False


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


def model_columns(regions: Sequence[RegionState], model_name: str) -> ModelColumns:
    serves = 0
    base: list[float] = []
    per_token: list[float] = []
    for i, region in enumerate(regions):
        terms = region.terms.get(model_name)
        if (
            region.summary is None
            or model_name == ANY_MODEL
            or (terms is not None and terms.serves)
        ):
            serves |= 1 << i
        # Without a summary the cost is the RTT alone: rtt + 0.0 + tokens × 0.0 is rtt
        # exactly (adding zero to a finite float or ∞ is exact).
        if region.summary is None:
            base.append(0.0)
            per_token.append(0.0)
        elif terms is None:
            base.append(math.inf)
            per_token.append(0.0)
        else:
            base.append(terms.queue_ms)
            per_token.append(terms.ms_per_token)
    return ModelColumns(
        serves,
        tuple(base),
        tuple(per_token),
        tuple(r.headroom(model_name) for r in regions),
    )


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

    @classmethod
    def of(cls, view: GlobalView) -> Prepared:
        regions = view.regions
        available = 0
        for i, region in enumerate(regions):
            if region.healthy and not region.drained:
                available |= 1 << i
        ids = tuple(r.id for r in regions)
        return cls(view, ids, available, list(ids) == sorted(ids))

    def columns(self, model_name: str) -> ModelColumns:
        found = self.models.get(model_name)
        if found is None:
            if len(self.models) >= _MEMO_SIZE:
                self.models.clear()
            found = self.models[model_name] = model_columns(self.view.regions, model_name)
        return found

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


class Rows(NamedTuple):
    """The survivors' columns for one (client point, country, model, survivor mask),
    in position order: what a decision reads besides the prompt size."""

    #: ``rtt + base``: the prompt-independent part of the ttft cost (same float order as
    #: ``(rtt + queue_ms) + tokens × ms_per_token``).
    fixed: tuple[float, ...]
    per_token: tuple[float, ...]
    headroom: tuple[float, ...]


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
    if found is None:
        rtts = tuple(prep.view.rtts(point, country).values())
        base, per_token, headroom = columns.base, columns.per_token, columns.headroom
        found = Rows(
            tuple([rtts[i] + base[i] for i in positions]),
            tuple([per_token[i] for i in positions]),
            tuple([headroom[i] for i in positions]),
        )
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


def _picker(spec: ProfileSpec) -> tuple[bool, spread.Params | None]:
    """(known, the spread picker's parameters): ``(True, None)`` is max-score."""
    name = spec.profile.picker
    for plugin in spec.plugins:
        if plugin.plugin_name == name:
            if plugin.type == spread.TYPE_NAME:
                return True, spread.Params.model_validate(dict(plugin.parameters))
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
    known, spread_params = _picker(spec)
    priced = _has_cost_model(spec)
    if filters is None or scorers is None or not known or priced is None:
        return None
    if spec.trace_scores is not None:
        return None
    return RegionPipeline(filters, scorers, spread_params, priced=priced)


# ---------------------------------------------------------------------------- deciding


class RegionPipeline:
    """Decides like the profile it was compiled from, over :class:`Prepared` views."""

    def __init__(
        self,
        filters: _Filters,
        scorers: tuple[_Scorer, ...],
        spread_params: spread.Params | None,
        *,
        priced: bool,
    ) -> None:
        self._filters = filters
        self._scorers = scorers
        self._weight_sum = 0.0
        for scorer in scorers:  # summed in order, like Profile._weight_sum
            self._weight_sum += scorer.weight
        self._spread = spread_params
        #: (ttft weight, load weight, ttft scale) when the scorers are exactly those two.
        self._ttft_load: tuple[float, float, float] | None = None
        if tuple(sc.kind for sc in scorers) == (ttft.TYPE_NAME, load.TYPE_NAME):
            self._ttft_load = (scorers[0].weight, scorers[1].weight, scorers[0].scale)
        self._priced = priced
        self._prepared: Prepared | None = None

    def prepared(self, view: GlobalView) -> Prepared:
        found = self._prepared
        if found is None or found.view is not view:
            found = self._prepared = Prepared.of(view)
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
        totals, costs = self._totals(request, prep, columns, mask, positions, point, country)
        order = _order(prep, positions, totals)
        # The first in that order is the picker's best: highest total, ties to the
        # smallest id (gtm.routing.better).
        chosen = best = positions[order[0]]
        spreads = self._spread is not None and self._spreads(request, prep, columns, best)
        if spreads:
            assert self._spread is not None
            chosen = _draw(request, columns, positions, totals, order, best, self._spread)
        names = tuple(map(prep.names(mask).__getitem__, order))
        ranked = tuple(zip(names, map(totals.__getitem__, order), strict=True))
        chosen_id = prep.ids[chosen]
        fallbacks = names[1:] if chosen == best else tuple([n for n in names if n != chosen_id])
        predicted = None
        if self._priced:
            if costs:
                cost = costs[positions.index(chosen)]
            else:
                (cost,) = self._costs(request, prep, columns, (chosen,), point, country)
            predicted = cost if math.isfinite(cost) and cost >= 0.0 else None
        return FastChoice(view.regions[chosen], ranked, fallbacks, predicted, spreads)

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
    ) -> tuple[list[float], list[float]]:
        """Each survivor's ``Σ wᵢ·sᵢ / Σ wᵢ`` (and its TTFT cost, when computed)."""
        if not self._scorers:
            return [0.0] * len(positions), []
        if self._ttft_load is not None:
            rows = survivor_rows(prep, columns, request.model, mask, positions, point, country)
            return self._ttft_and_load(request, rows)
        costs: list[float] = []
        sums: list[float] | None = None
        for scorer in self._scorers:
            if scorer.kind == ttft.TYPE_NAME:
                if not costs:
                    costs = self._costs(request, prep, columns, positions, point, country)
                column = _ttft_scores(costs, scorer.scale)
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
        return [t / ws for t in sums], costs

    def _ttft_and_load(self, request: RouteRequest, rows: Rows) -> tuple[list[float], list[float]]:
        """The usual profile (``ttft-scorer`` then ``load-scorer``) in one pass: the
        same expressions as :func:`_ttft_scores` and the general loop, fused."""
        assert self._ttft_load is not None
        w0, w1, scale = self._ttft_load
        ws = self._weight_sum
        tokens = request.input_tokens
        costs = [a + tokens * b for a, b in zip(rows.fixed, rows.per_token, strict=True)]
        headroom = rows.headroom
        best = min(filter(math.isfinite, costs), default=None)
        if best is None:
            return [(w0 * 0.0 + w1 * h) / ws for h in headroom], costs
        exp, inf = math.exp, math.inf
        totals = [
            (w0 * (1.0 if (x := c - best) <= 0.0 else exp(-x / scale) if x < inf else 0.0) + w1 * h)
            / ws
            for c, h in zip(costs, headroom, strict=True)
        ]
        return totals, costs

    def _costs(
        self,
        request: RouteRequest,
        prep: Prepared,
        columns: ModelColumns,
        positions: tuple[int, ...],
        point: GeoPoint | None,
        country: str | None,
    ) -> list[float]:
        # The view's latency model returns a dict built in view order (memoised per
        # client point across views): its values line up with the positions.
        rtts = tuple(prep.view.rtts(point, country).values())
        tokens = request.input_tokens
        base, per_token = columns.base, columns.per_token
        # ttft-scorer's formula: (rtt + queue_ms) + tokens × ms_per_token.
        return [rtts[i] + base[i] + tokens * per_token[i] for i in positions]

    # ------------------------------------------------------------------ pick

    def _spreads(
        self, request: RouteRequest, prep: Prepared, columns: ModelColumns, best: int
    ) -> bool:
        """``HeadroomSpreadPicker.spreads``: the best is near saturation or the client
        was displaced from a nearer, unavailable region."""
        params = self._spread
        assert params is not None
        if columns.headroom[best] <= 1.0 - params.saturation:
            return True
        region = prep.view.regions[best]
        client = request.client.location  # what the picker reads
        if client is None or not region.outages:
            return False
        distance = client.distance_km(region.location)
        return any(client.distance_km(o) < distance for o in region.outages)


def _ttft_scores(costs: list[float], scale: float) -> list[float]:
    """``gtm.routing.cost.scores_from_costs`` over a list (same expression, same order)."""
    best = min(filter(math.isfinite, costs), default=None)
    if best is None:
        return [0.0] * len(costs)
    exp, inf = math.exp, math.inf
    return [
        1.0 if (excess := cost - best) <= 0.0 else exp(-excess / scale) if excess < inf else 0.0
        for cost in costs
    ]


def _order(prep: Prepared, positions: tuple[int, ...], totals: list[float]) -> list[int]:
    """Indices into ``positions``, by total descending, then id ascending."""
    if prep.id_ordered:  # a stable sort keeps equal totals in (id) order
        return sorted(range(len(totals)), key=totals.__getitem__, reverse=True)
    ids = prep.ids
    return sorted(range(len(totals)), key=lambda k: (-totals[k], ids[positions[k]]))


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


def _draw(
    request: RouteRequest,
    columns: ModelColumns,
    positions: tuple[int, ...],
    totals: list[float],
    order: list[int],
    best: int,
    params: spread.Params,
) -> int:
    """``HeadroomSpreadPicker._spread``: a headroom-weighted draw among the best."""
    floor = params.band * totals[positions.index(best)]
    pool = [positions[k] for k in order if totals[k] >= floor][: params.spread_over]
    weights = [columns.headroom[i] for i in pool]
    total = sum(weights)
    if total <= 0.0:
        return best
    draw = request_rng(request, params.seed).random() * total
    for position, weight in zip(pool, weights, strict=True):
        draw -= weight
        if draw < 0.0:
            return position
    return pool[-1]

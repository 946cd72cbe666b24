"""The global tier's TTFT cost and its TTFT + load total live in this module, in every
form: the scalar reference (:func:`cost_ms`: one region's price, what the cost model
reports), the column forms the scorer and the fast path run over a decision's survivors
(:func:`fixed_column`, :func:`costs_column`, :func:`fused_totals`, :class:`ShiftedCosts`)
and the binding to their compiled twin, :mod:`global_lb.plugins._ttft` in this
directory; tests/unit/global_lb/plugins/test_ttft.py fails if any two forms disagree by
one bit.

``ttft-scorer`` / ``ttft-cost-model``: predicted time-to-first-token at each region
(ARCHITECTURE §2), in ms::

    RTT client → region                      measured map, else 26 ms + 0.0143 ms/km
  + the region's wait before the prefill starts                     (``base``)
  + this request's prompt tokens × ms per token on the GPU that takes it (``per_token``)

computed as ``(rtt + base) + tokens × per_token`` with :func:`cost_terms`' ``base`` and
``per_token``: the region's :class:`~global_lb.view.ModelTerms`, priced by the GPU that
would take the request (:func:`gtm.routing.cost.prefill_terms`): its fastest free GPU
(no wait, that GPU class's rate) when no slower than its average GPU, else its pooled
backlog (queued prefill tokens / region prefill rate) at its average rate. Its summary's
per-GPU-class breakdown says which GPUs are free; a summary without one (from a gtm
before it) is priced by the average, as it was then. A region without a summary
(nothing published yet) costs its RTT alone (``base = per_token = 0``: adding zero is
exact); a summary that lacks the model, or a region with no prefill capacity, costs ∞.
Scores are
``exp(-(cost − best) / scale_ms)``: 1 for the cheapest region, 1/e per ``scale_ms`` of
extra predicted TTFT (:func:`gtm.routing.cost.scores_from_costs`, the core's). The same
object is the profile's cost model, so ``Decision.predicted_ttft_ms`` is the choice's
cost.

**The fused total.** The usual profile scores ``ttft-scorer`` then ``load-scorer``
(headroom); its total is ``(w_ttft·score + w_load·headroom) / Σw``. The compiled form
writes the score as ``exp((best − cost) / scale)``: the same float for every cost, since
IEEE subtraction and division are antisymmetric (``best − cost = −(cost − best)``),
``exp(-0.0)`` is 1.0 and ``exp(-inf)`` 0.0. When every survivor has the same per-token
time (one GPU type everywhere) the prompt adds the same ``tokens × per_token`` to each
cost: rounding is monotonic, so the cheapest prompt-independent part stays the
cheapest, and only the chosen region's cost is read (:class:`ShiftedCosts`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import ClassVar, NamedTuple

import numpy as np
from pydantic import Field

from global_lb.batch import GlobalCap, PerModel, RegionBatch, bits, gather
from global_lb.plugins import _ttft
from global_lb.view import GlobalView, RegionState
from gtm.models import Frozen
from gtm.routing import Capability, Plugin
from gtm.routing.cost import scores_from_costs
from gtm.routing.framework import Floats

TYPE_NAME = "ttft-scorer"
COST_MODEL_TYPE_NAME = "ttft-cost-model"

#: Default score scale: 100 ms of extra TTFT costs a factor e. About the RTT between
#: neighbouring continents' regions (US east ↔ EU west is ~75 ms P50 in the Azure
#: data), so a region one ocean away must be that much less loaded to win.
DEFAULT_SCALE_MS = 100.0


class Params(Frozen):
    scale_ms: float = Field(default=DEFAULT_SCALE_MS, gt=0.0, le=1e6, allow_inf_nan=False)


# ------------------------------------------------------------------ scalar reference


def cost_terms(region: RegionState, model: str) -> tuple[float, float]:
    """``(base, per_token)`` of ``region`` for ``model``: its cost is
    ``(rtt + base) + tokens × per_token``."""
    if region.summary is None:
        return 0.0, 0.0
    terms = region.terms.get(model)
    if terms is None:
        return math.inf, 0.0
    # The request is prefilled on one GPU: the one that would take it (ModelTerms);
    # queue_ms is ∞ (and ms_per_token 0) where nothing can prefill.
    return terms.queue_ms, terms.ms_per_token


def with_prompt(fixed: float, per_token: float, tokens: int) -> float:
    """The cost from its prompt-independent part ``fixed = rtt + base``."""
    return fixed + tokens * per_token


def cost_ms(rtt: float, base: float, per_token: float, tokens: int) -> float:
    """The predicted TTFT at one region: the formula, written once."""
    return with_prompt(rtt + base, per_token, tokens)


def prediction(cost: float) -> float | None:
    """What a decision reports as its predicted TTFT (``None``: not finite)."""
    return cost if math.isfinite(cost) and cost >= 0.0 else None


def lowest(costs: Sequence[float]) -> float | None:
    """The smallest finite cost (the scores' ``best``; ``None``: none is finite)."""
    return min(filter(math.isfinite, costs), default=None)


class CostTerms(NamedTuple):
    """Every position's :func:`cost_terms` for one model, as two columns."""

    base: tuple[float, ...]
    per_token: tuple[float, ...]


def _columns(entries: tuple[tuple[float, float], ...]) -> CostTerms:
    return CostTerms(tuple([e[0] for e in entries]), tuple([e[1] for e in entries]))


def _patched(terms: CostTerms, entries: tuple[tuple[float, float], ...], changed: int) -> CostTerms:
    base, per_token = list(terms.base), list(terms.per_token)
    for i in bits(changed):
        base[i], per_token[i] = entries[i]
    return CostTerms(tuple(base), tuple(per_token))


class TtftScorer(Plugin):
    """The scorer and the cost model (one object): cost terms are worked out once per
    view and model (``prepare``), RTTs per client by the view's latency model."""

    capabilities: ClassVar[frozenset[StrEnum]] = frozenset(
        {
            Capability.PREPARE,
            Capability.SCORES_IN_RANGE,
            GlobalCap.SURVIVOR_SCORES,
            GlobalCap.TTFT_SCORE,
        }
    )

    def __init__(self, name: str = TYPE_NAME, params: Params | None = None) -> None:
        super().__init__(name)
        self._scale = (params or Params()).scale_ms
        self._last: PerModel[tuple[float, float], CostTerms] | None = None

    @property
    def scale_ms(self) -> float:
        return self._scale

    def prepare(self, view: GlobalView, /) -> PerModel[tuple[float, float], CostTerms]:
        found = self._last = PerModel(view, cost_terms, _columns, self._last, _patched)
        return found

    def terms(self, batch: RegionBatch, /) -> CostTerms:
        prepared: PerModel[tuple[float, float], CostTerms] | None = batch.prepared.get(self)
        if prepared is None:
            prepared = self.prepare(batch.view)  # type: ignore[arg-type]
        return prepared.get(batch.model)

    def survivor_costs(
        self, batch: RegionBatch, positions: tuple[int, ...], /
    ) -> tuple[float, ...]:
        """The costs at ``positions``, in their order (the column form)."""
        view: GlobalView = batch.view  # type: ignore[assignment]
        point, country = batch.point, batch.country
        rtts = view.latency.row(view.signature, view.regions, point, country, positions)
        base, per_token = self.terms(batch)
        fixed = fixed_column(rtts, gather(base, positions))
        tokens: int = batch.request.input_tokens  # type: ignore[attr-defined]
        return costs_column(fixed, tuple(gather(per_token, positions)), tokens)

    def survivor_scores(self, batch: RegionBatch, positions: tuple[int, ...], /) -> list[float]:
        ids = batch.ids
        costs = self.survivor_costs(batch, positions)
        return scores_column([ids[i] for i in positions], costs, self._scale)

    def scores(self, batch: RegionBatch, /) -> Floats:
        survivors = batch.survivors
        column = np.zeros(len(batch), dtype=np.float64)
        column[survivors] = self.survivor_scores(batch, tuple(survivors.tolist()))
        return column

    def costs_ms(self, batch: RegionBatch, /) -> Mapping[int, float] | PositionCosts:
        state = batch.state
        priced = None if state is None else state.priced()
        return PositionCosts(batch) if priced is None else priced


class PositionCosts(Sequence[float]):
    """The cost at each position, worked out when read (a decision reads its choice's)."""

    __slots__ = ("_batch",)

    def __init__(self, batch: RegionBatch) -> None:
        self._batch = batch

    def __getitem__(self, position: int) -> float:  # type: ignore[override]  # no slices
        batch = self._batch
        region = batch.regions[position]
        base, per_token = cost_terms(region, batch.model)
        tokens: int = batch.request.input_tokens  # type: ignore[attr-defined]
        return cost_ms(batch.ctx.rtt_ms(region), base, per_token, tokens)

    def __len__(self) -> int:
        return len(self._batch)


# ------------------------------------------------------------------ column forms


def fixed_column(rtts: Sequence[float], base: Sequence[float]) -> tuple[float, ...]:
    """Each survivor's ``rtt + base`` (the prompt-independent part of its cost)."""
    return tuple(map(operator.add, rtts, base))


def costs_column(
    fixed: tuple[float, ...], per_token: tuple[float, ...], tokens: int
) -> tuple[float, ...]:
    """Each survivor's cost (compiled: :func:`_ttft.shifted_costs`)."""
    return _ttft.shifted_costs(fixed, per_token, tokens)


def scores_column(ids: Sequence[str], costs: Sequence[float], scale_ms: float) -> list[float]:
    """The survivors' TTFT scores, in their order (the core's formula)."""
    return list(scores_from_costs(dict(zip(ids, costs, strict=True)), scale_ms).values())


class ShiftedCosts(Sequence[float]):
    """``fixed[k] + shift`` on demand: the survivors' costs when they share one per-token
    time and only the chosen one's is read (the predicted TTFT)."""

    __slots__ = ("_fixed", "_shift", "per_token")

    def __init__(self, fixed: tuple[float, ...], shift: float, per_token: float) -> None:
        self._fixed = fixed
        self._shift = shift
        #: Every survivor's per-token time.
        self.per_token = per_token

    def fixed(self, k: int) -> float:
        return self._fixed[k]

    def __getitem__(self, k: int) -> float:  # type: ignore[override]  # no slices
        return self._fixed[k] + self._shift

    def __len__(self) -> int:
        return len(self._fixed)


def fused_totals(
    fixed: tuple[float, ...],
    per_token: tuple[float, ...],
    uniform: float | None,
    low: float | None,
    headroom: tuple[float, ...],
    tokens: int,
    weights: tuple[float, float, float],
    scale_ms: float,
) -> tuple[list[float], Sequence[float], int]:
    """The ``ttft-scorer`` then ``load-scorer`` totals in one compiled pass: each
    survivor's total, its cost, and the index of the first highest total.

    ``uniform``: every survivor's per-token time when they are all equal, with ``low``
    the smallest finite ``fixed``; ``weights``: ``(w_ttft, w_load, Σw)``."""
    w_ttft, w_load, weight_sum = weights
    if uniform is not None:
        shift = tokens * uniform
        shifted = ShiftedCosts(fixed, shift, uniform)
        if low is None:
            totals, top = _ttft.load_totals(headroom, w_ttft, w_load, weight_sum)
        else:
            totals, top = _ttft.ttft_load_totals(
                fixed, headroom, shift, low + shift, w_ttft, w_load, weight_sum, scale_ms
            )
        return totals, shifted, top
    costs = _ttft.shifted_costs(fixed, per_token, tokens)
    best = lowest(costs)
    if best is None:
        totals, top = _ttft.load_totals(headroom, w_ttft, w_load, weight_sum)
    else:
        totals, top = _ttft.ttft_load_totals(
            costs, headroom, 0.0, best, w_ttft, w_load, weight_sum, scale_ms
        )
    return totals, costs, top

"""Zone choice without the decision trace: the regional profile's fast path.

:meth:`gtm.routing.Profile.choose` checks every plugin's output against the framework's
contracts and builds a full :class:`~gtm.models.DecisionTrace` (a filter step per filter,
a score record per survivor, the predicted TTFT) on every decision. A region has a
handful of zones, so that bookkeeping — not the plugins — is most of a regional
decision's cost: ~3/4 of ``RegionalRouter.decide`` in the fleet simulator, which makes
~10⁶ of them per run and never reads the trace (neither does ``regional_lb.service``).

:class:`FastZoneChoice` runs **the same plugin objects** (built from the same
:class:`~gtm.routing.ProfileSpec` with the same registry) the same way — filters in
order, each scorer over the survivors, totals ``Σ wᵢ·sᵢ / Σ wᵢ`` summed left to right in
the profile's order, the profile's picker — and only keeps what the choice needs. It
returns ``None`` whenever the reference would do something else than pick: a filter
empties the set (the reference names the filter and builds the partial trace the
router's refusal and queue reasons need), a scorer breaks the [0, 1] contract (the
reference repairs and records it), ids are not unique, a plugin raises. The router then
runs the reference profile, so every outcome is the reference's.
``tests/unit/regional_lb/test_fastpath.py`` checks ``RegionalRouter.decide`` and
``place`` with and without it on random views, requests and accounting (hypothesis).

Use: ``RegionalRouter(..., fast=FastZoneChoice.compile(spec))`` and ``decide(...,
trace=False)``; the decision then has ``decision=None`` (no trace record) and is
otherwise equal to the traced one.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from itertools import repeat
from typing import Any, cast

from gtm.models import RouteRequest, Tier
from gtm.routing import PluginRegistry, ProfileSpec
from gtm.routing.legacy import Scored
from regional_lb.view import ZoneContext, ZoneState

#: ``Scored(candidate, total)`` without the NamedTuple's Python-level ``_make``.
_new_tuple = tuple.__new__


class Deferred(Enum):
    """Why the fast path chose no zone."""

    #: The filters removed every zone (or none was offered): the reference raises
    #: ``NoEligibleCandidate`` — ``place`` needs nothing more, ``decide`` its trace.
    EMPTY = "empty"
    #: Anything else unusual (a score to repair, a plugin error): the reference decides.
    REFERENCE = "reference"


class FastZoneChoice:
    """A profile's filters, weighted scorers and picker, run without a trace."""

    __slots__ = ("_filters", "_picker", "_scorers", "_weight_sum", "_weights")

    def __init__(
        self,
        filters: Sequence[Any],
        scorers: Sequence[tuple[Any, float]],
        picker: Any,
    ) -> None:
        self._filters = tuple(filters)
        self._scorers = tuple(s for s, _ in scorers)
        self._weights = tuple(float(w) for _, w in scorers)
        # Summed in the same order as the reference runner's (gtm.routing.profile).
        total = 0.0
        for weight in self._weights:
            total += weight
        self._weight_sum = total
        self._picker = picker

    @classmethod
    def compile(cls, spec: ProfileSpec, registry: PluginRegistry | None = None) -> FastZoneChoice:
        """The fast path of ``spec``, with plugins built by ``registry`` (default: the
        regional tier's) exactly as :func:`regional_lb.profiles.build` builds them."""
        if registry is None:
            from regional_lb.profiles import regional_registry  # profiles imports the view

            registry = regional_registry()
        # Building the reference profile validates the spec (names, references, weights)
        # with the registry's own rules and errors.
        registry.build_profile(spec, tier=Tier.REGIONAL)
        plugins = {p.plugin_name: registry.build_plugin(p) for p in spec.plugins}
        body = spec.profile
        # build_profile checked there is exactly one picker.
        pickers = (body.picker,) if isinstance(body.picker, str) else tuple(body.picker or ())
        return cls(
            [plugins[name] for name in body.filters],
            [(plugins[ref.ref], ref.weight) for ref in body.scorers],
            plugins[pickers[0]],
        )

    def choose(
        self, request: RouteRequest, zones: Sequence[ZoneState], ctx: ZoneContext
    ) -> ZoneState | None:
        """The zone the reference profile would choose, or ``None``: let the reference
        decide (it refuses, repairs a score, or a plugin fails)."""
        picked = self.pick(request, zones, ctx)
        return None if isinstance(picked, Deferred) else picked

    def pick(
        self, request: RouteRequest, zones: Sequence[ZoneState], ctx: ZoneContext
    ) -> ZoneState | Deferred:
        """Like :meth:`choose`, saying why it chose none."""
        try:
            return self._choose(request, zones, ctx)
        except Exception:  # the reference runs again and reports it, with its own error
            return Deferred.REFERENCE

    def _choose(
        self, request: RouteRequest, zones: Sequence[ZoneState], ctx: ZoneContext
    ) -> ZoneState | Deferred:
        current: Sequence[ZoneState] = zones
        if not current:
            return Deferred.EMPTY
        if len({z.id for z in current}) != len(current):
            return Deferred.REFERENCE
        for plugin in self._filters:
            result = plugin.filter(request, current, ctx)
            if len(result.kept) + len(result.removed) != len(current):
                return Deferred.REFERENCE
            current = result.kept
            if not current:
                return Deferred.EMPTY
        ids = [z.id for z in current]
        totals = [0.0] * len(ids)
        for plugin, weight in zip(self._scorers, self._weights, strict=True):
            raw = plugin.score(request, current, ctx)
            column = list(raw.values()) if list(raw) == ids else [raw[i] for i in ids]
            for value in column:
                # Exactly the values the reference keeps unrepaired (finite floats or
                # ints in [0, 1]); anything else is repaired and recorded there.
                if type(value) not in (float, int) or not 0.0 <= value <= 1.0:
                    return Deferred.REFERENCE
            totals = [t + weight * s for t, s in zip(totals, column, strict=True)]
        ws = self._weight_sum
        finals = [t / ws for t in totals] if self._scorers else totals
        scored = cast(
            "list[Scored[ZoneState]]",
            list(map(_new_tuple, repeat(Scored), zip(current, finals, strict=True))),
        )
        choice: ZoneState = self._picker.pick(request, scored)
        return choice if choice in current else Deferred.REFERENCE


__all__ = ["Deferred", "FastZoneChoice"]

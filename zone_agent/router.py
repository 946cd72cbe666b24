"""The zone's routing profile: its data layout and fast paths on the core runner.

A zone decides with :class:`gtm.routing.runner.Runner`, the one runner of every tier;
the zone gives it its layout (:class:`~zone_agent.batch.ZoneBatch`: candidates are
positions in the requested model's index, columns worked out on first use), its plugins
(:mod:`zone_agent.plugins`) and its fast paths (:mod:`zone_agent.fastpaths`, chosen by
the capabilities the plugin classes declare). :class:`ZoneProfile` is what the agent
and the simulator call: it finds the model's index, removes the GPUs a retry already
tried (the first step of the trace), runs the runner, and returns a
:class:`ZoneDecision` — the chosen GPU and what the agent charges for it, the trace
built only when asked for.

Decisions are sans-io: synchronous, over an immutable :class:`~zone_agent.view.ZoneView`
plus the agent's in-flight charges, read when the decision starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from gtm.errors import PluginError
from gtm.models import Decision, Tier
from gtm.routing.framework import (
    CostModel,
    Filter,
    Picker,
    Removal,
    Scorer,
    capabilities_of,
)
from gtm.routing.metrics import RoutingMetrics
from gtm.routing.runner import (
    DEFAULT_PLUGIN_TIMING_EVERY,
    Outcome,
    Runner,
    Scored,
    Step,
    Weighted,
)
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.errors import ModelNotServed
from zone_agent.fastpaths import FAST_PATHS
from zone_agent.request import ZoneRequest
from zone_agent.view import Bools, Floats, GpuState, ModelIndex, ZoneView

#: Name of the implicit first step that removes GPUs a retry already tried.
RETRY_STEP = "retry-exclude"

# The runner's contracts under the names the zone's plugins and tests have used.
Batch = ZoneBatch
GpuFilter = Filter
GpuScorer = Scorer
GpuPicker = Picker
GpuCostModel = CostModel
WeightedGpuScorer = Weighted

__all__ = [
    "RETRY_STEP",
    "Batch",
    "GpuCostModel",
    "GpuFilter",
    "GpuPicker",
    "GpuScorer",
    "ModelNotServed",
    "Removal",
    "Scored",
    "WeightedGpuScorer",
    "ZoneBatch",
    "ZoneDecision",
    "ZoneProfile",
]


def _already_tried(position: int) -> str:
    return "already tried by this request"


class ZoneDecision(NamedTuple):
    """A decision: the chosen GPU, what the agent charges for it, and everything needed
    to explain it on demand (the runner's :class:`~gtm.routing.runner.Outcome`)."""

    outcome: Outcome[ZoneBatch]
    gpu: GpuState
    #: Prompt tokens the chosen GPU still has to prefill (its cache credit taken off).
    uncached_tokens: float
    #: Leading prefix blocks of the prompt it recently got from us.
    matched_blocks: int

    @property
    def profile(self) -> str:
        return self.outcome.runner.name

    @property
    def request(self) -> ZoneRequest:
        return self.outcome.batch.request

    @property
    def model_index(self) -> ModelIndex:
        return self.outcome.batch.index

    @property
    def choice(self) -> int:
        return self.outcome.choice

    @property
    def gpu_id(self) -> str:
        return self.outcome.batch.index.ids[self.outcome.choice]

    @property
    def predicted_ttft_ms(self) -> float | None:
        return self.outcome.predicted_ttft_ms

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.outcome.steps

    @property
    def scored(self) -> Scored | None:
        """The scores when the decision needed them (None: a fast path chose)."""
        return self.outcome.scored

    @property
    def alive(self) -> Bools:
        return self.outcome.batch.alive

    @property
    def weights(self) -> tuple[tuple[str, float], ...]:
        return self.outcome.runner.weights

    @property
    def picker(self) -> str:
        return self.outcome.runner.picker.name

    @property
    def totals(self) -> Floats:
        """Each candidate's weighted total score (values of removed ones are ignored)."""
        return self.outcome.totals

    @property
    def scores(self) -> tuple[tuple[str, Floats], ...]:
        """Each scorer's name and scores."""
        return self.outcome.scores

    def to_decision(self, top: int | None = 16) -> Decision:
        """The decision as a :class:`gtm.models.Decision` (scores of the ``top`` best
        survivors and always the choice; None: all)."""
        return self.outcome.to_decision(top)


class ZoneProfile:
    """A zone routing profile: the core runner over the zone's layout, its fast paths
    (:data:`zone_agent.fastpaths.FAST_PATHS`) and the zone's rule that every profile
    starts with the health filter."""

    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[Weighted],
        picker: Picker,
        *,
        cost_model: CostModel | None = None,
        metrics: RoutingMetrics | None = None,
        timer: Callable[[], float] = time.perf_counter,
        plugin_timing_every: int = DEFAULT_PLUGIN_TIMING_EVERY,
        fast_paths: bool = True,
        trace_scores: int | None = None,
    ) -> None:
        """``fast_paths=False`` runs every decision through the plugins one by one: the
        reference the fast paths are tested and benchmarked against."""
        runner: Runner[ZoneBatch] = Runner(
            name,
            Tier.ZONE,
            filters,
            scorers,
            picker,
            cost_model=cost_model,
            fast_paths=FAST_PATHS if fast_paths else (),
            metrics=metrics,
            timer=timer,
            plugin_timing_every=plugin_timing_every,
            trace_scores=trace_scores,
        )
        self._use(runner)

    @classmethod
    def of(cls, runner: Runner[ZoneBatch]) -> ZoneProfile:
        """The profile deciding with ``runner`` (built by the zone registry)."""
        profile = cls.__new__(cls)
        profile._use(runner)
        return profile

    def _use(self, runner: Runner[ZoneBatch]) -> None:
        first = runner.filters[0] if runner.filters else None
        if ZoneCapability.HEALTH not in capabilities_of(first):
            raise PluginError(
                f"profile {runner.name!r}: the first filter must be a health-filter "
                "(no profile may route to an ejected, draining or unchecked GPU)"
            )
        self.runner = runner
        self.name = runner.name
        self.filters = runner.filters
        self.scorers = runner.scorers
        self.picker = runner.picker
        self.cost_model = runner.cost_model
        self.weights = runner.weights

    @property
    def fast_paths(self) -> tuple[str, ...]:
        """Names of the fast paths this profile takes."""
        return self.runner.fast_paths

    def without_fast_paths(self) -> ZoneProfile:
        """The same profile (the same plugin objects) deciding with the reference runner."""
        return ZoneProfile.of(self.runner.reference())

    def decide(
        self, request: ZoneRequest, view: ZoneView, *, exclude: frozenset[str] = frozenset()
    ) -> ZoneDecision:
        """Choose a GPU for ``request``; ``exclude``: GPUs this request already tried.

        Raises:
            ModelNotServed: no GPU of the zone serves the model.
            NoEligibleCandidate: a filter removed every candidate (``filter_name`` says which;
                ``trace`` holds the steps up to there).
            PluginError: a plugin raised something that is not a GtmError.
        """
        index = view.by_model.get(request.model)
        if index is None or not index.ids:
            raise ModelNotServed(request.model)
        batch = ZoneBatch(request, view, index)
        pre = None
        if exclude:
            tried = np.array([gid in exclude for gid in index.ids], dtype=np.bool_)
            pre = Step(RETRY_STEP, tried, _already_tried)
        outcome = self.runner.decide(batch, pre)
        choice = outcome.choice
        return ZoneDecision(
            outcome,
            view.gpus[index.positions.item(choice)],
            batch.uncached_at(choice),
            batch.blocks_at(choice),
        )

"""The zone's routing profile: its data layout and fast paths on the core runner.

A zone decides with :class:`gtm.routing.runner.Runner`, the one runner of every tier,
over its layout (:class:`~zone_agent.batch.ZoneBatch`: candidates are positions in the
requested model's index, columns worked out on first use), its plugins
(:mod:`zone_agent.plugins`) and its fast paths (:mod:`zone_agent.fastpaths`).
:class:`ZoneProfile` is what the agent and the simulator call. Decisions are sans-io:
synchronous, over an immutable :class:`~zone_agent.view.ZoneView` plus the agent's
in-flight charges, read when the decision starts.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gtm.errors import PluginError
from gtm.models import Decision
from gtm.routing.framework import capabilities_of
from gtm.routing.runner import Outcome, Runner, Step
from zone_agent.batch import ZoneBatch, ZoneCapability
from zone_agent.errors import ModelNotServed
from zone_agent.request import ZoneRequest
from zone_agent.view import GpuState, ModelIndex, ZoneView

#: Name of the implicit first step that removes GPUs a retry already tried.
RETRY_STEP = "retry-exclude"
#: Name of the implicit first step that removes GPUs the zone's flow control does not
#: admit the request to now (zone_agent.flow).
ADMISSION_STEP = "admission"
#: Builds a NamedTuple from a tuple of its fields in C, as ``NamedTuple._make`` does: the
#: class's own ``__new__`` is a generated Python function (one call more per decision).
_new_tuple = tuple.__new__


class ZoneDecision(NamedTuple):
    """A decision: the chosen GPU, what the agent charges for it, and everything needed
    to explain it on demand (the runner's :class:`~gtm.routing.runner.Outcome`).

    The fields after ``matched_blocks`` are what the agent reads of the outcome, copied
    out when the decision is made: it reads them several times per request, and a field
    is read in C where a property is a Python call.
    """

    outcome: Outcome[ZoneBatch]
    gpu: GpuState
    #: Prompt tokens the chosen GPU still has to prefill (its cache credit taken off).
    uncached_tokens: float
    #: Leading prefix blocks of the prompt it recently got from us.
    matched_blocks: int
    #: The chosen GPU's id: ``model_index.ids[choice]``.
    gpu_id: str
    #: The chosen position in :attr:`model_index`: ``outcome.choice``.
    choice: int
    #: ``outcome.predicted_ttft_ms``.
    predicted_ttft_ms: float | None
    #: ``outcome.batch.request``.
    request: ZoneRequest
    #: The requested model's index: ``outcome.batch.index``.
    model_index: ModelIndex
    #: The profile's name: ``outcome.runner.name``.
    profile: str

    def to_decision(self, top: int | None = 16) -> Decision:
        """The decision as a :class:`gtm.models.Decision` (scores of the ``top`` best
        survivors and always the choice; None: all)."""
        return self.outcome.to_decision(top)


class ZoneProfile:
    """A zone routing profile: the core runner over the zone's layout, with the zone's
    rule that every profile starts with the health filter. A decision finds the model's
    index, removes the GPUs a retry already tried (the first step of the trace), runs the
    runner, and returns a :class:`ZoneDecision`: the chosen GPU and what the agent
    charges for it, the trace built only when asked for."""

    def __init__(self, runner: Runner[ZoneBatch]) -> None:
        first = runner.filters[0] if runner.filters else None
        if ZoneCapability.HEALTH not in capabilities_of(first):
            raise PluginError(
                f"profile {runner.name!r}: the first filter must be a health-filter "
                "(no profile may route to an ejected, draining or unchecked GPU)"
            )
        self.runner = runner
        self.name = runner.name
        self.weights = runner.weights

    def without_fast_paths(self) -> ZoneProfile:
        """The same plugins deciding one by one: the reference the fast paths are tested
        and benchmarked against."""
        return ZoneProfile(self.runner.reference())

    def decide(
        self,
        request: ZoneRequest,
        view: ZoneView,
        *,
        exclude: frozenset[str] = frozenset(),
        not_admitted: frozenset[str] = frozenset(),
    ) -> ZoneDecision:
        """Choose a GPU for ``request``; ``exclude``: GPUs this request already tried;
        ``not_admitted``: GPUs the zone's flow control keeps it from now.

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
            pre = Step(RETRY_STEP, tried, lambda _: "already tried by this request")
        elif not_admitted:
            held = np.array([gid in not_admitted for gid in index.ids], dtype=np.bool_)
            pre = Step(ADMISSION_STEP, held, lambda _: "over the zone's SLO bounds now")
        outcome = self.runner.decide(batch, pre)
        choice = outcome.choice
        if request.prefix_hashes:
            uncached, blocks = batch.prefill_at(choice)
        else:  # a prompt shorter than a block: no GPU holds any of it
            uncached, blocks = float(request.input_tokens), 0
        fields = (
            outcome,
            view.gpus[index.positions.item(choice)],
            uncached,
            blocks,
            index.ids[choice],
            choice,
            outcome.predicted_ttft_ms,
            request,
            index,
            self.name,
        )
        return _new_tuple(ZoneDecision, fields)

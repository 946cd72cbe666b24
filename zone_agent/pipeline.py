"""The zone's filter → score → pick runner, over arrays.

The contracts are those of :mod:`gtm.routing` (README there): filters remove candidates
and say why, scorers return values in [0, 1] combined as ``Σ wᵢ·sᵢ / Σ wᵢ``, exactly one
picker, a trace of who removed what (recorded as :class:`gtm.models.Decision`),
``NoEligibleCandidate`` naming the filter that emptied the set, per-plugin latency in
``gtm_routing_plugin_duration_seconds``. Profiles are configured with the same
:class:`~gtm.routing.registry.ProfileSpec` and built from a
:class:`~gtm.routing.registry.PluginRegistry`.

What differs is the data layout. The generic :class:`~gtm.routing.profile.Profile` passes
candidate objects and ``{id: score}`` dicts between plugins and validates a complete
trace for every decision: ~85 µs for 10 candidates and ~4.5 ms for 1,000 (its README).
A zone has up to thousands of GPUs and decides for every request, so here candidates
are positions in a :class:`~zone_agent.view.ModelIndex`, a filter returns a boolean
mask, a scorer a float array, and the trace is assembled only when someone asks for it
(:meth:`ZoneDecision.to_decision`: ``/v1/assign``, debug logs). A decision is then a
handful of numpy operations: see ``bench/zone_decision.py``.

Two fast paths cut the numpy calls of the usual decision (``bench/zone_decision.py``
prints both ways; ``tests/property/test_zone_agent_decisions.py`` demands the same
choice, costs and trace from both on random zones):

* :class:`FusedFilters` — the default chain (healthy, serves-model, fits, canary) as one
  step: what depends on the view alone is worked out once per view and model, and only
  the free-KV rule runs per request; anything unusual (a retry, a half-open GPU, a
  canary or version pin, a request a hard rule may refuse) runs the filters one by one;
* :class:`CheapestPick` — a lone cost scorer under the plain max-score picker picks the
  cheapest survivor, and the scores are worked out only for a trace;
* :class:`BlendPick` — the default's cost scorer and KV-cache room scorer under the plain
  max-score picker: the weighted sum and the pick in one C call (``_blend.c``).

Decisions whose plugins are timed (one in ``plugin_timing_every``) take the reference
path, so each plugin's histogram times that plugin. ``ZoneProfile.without_fast_paths``
is the reference runner.

Decisions are sans-io: synchronous, over an immutable :class:`~zone_agent.view.ZoneView`
plus a copy of the agent's in-flight charges taken when the decision starts.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any, NamedTuple, NoReturn, Protocol, TypeVar, cast, runtime_checkable

import numpy as np

from gtm.errors import GtmError, NoEligibleCandidate, PluginError, RoutingError
from gtm.models import CandidateScore, Decision, DecisionTrace, FilterStep, Tier
from gtm.routing.framework import ExtensionPoint
from gtm.routing.metrics import RoutingMetrics
from zone_agent._np import fany, fmax, fmin
from zone_agent.accounting import Accounting
from zone_agent.costs import blend
from zone_agent.costs.blend import free_blocks
from zone_agent.prefix import set_bits
from zone_agent.request import ZoneRequest
from zone_agent.view import Bools, Floats, GpuState, Ints, ModelIndex, ZoneView

T = TypeVar("T")

#: A lazily computed attribute not computed yet (where None is a value).
_UNSET = object()

#: Key of the cost model's latency observer (its name may also be a scorer's).
_COST_KEY = "\0cost-model"

#: Name of the implicit first step that removes GPUs a retry already tried.
RETRY_STEP = "retry-exclude"


class ModelNotServed(RoutingError):
    """No GPU of the zone serves the requested model."""

    def __init__(self, model: str) -> None:
        super().__init__(f"no GPU in this zone serves model {model!r}")
        self.model = model


# ---------------------------------------------------------------------------- the batch


class StreamsHint(NamedTuple):
    """Where the survivors' streams are in the accounting (worked out once per view)."""

    #: The survivors' accounting slots.
    slots: Ints
    #: The accounting's other slots, when it had ``slot_count`` slots (None: many).
    outside: tuple[int, ...] | None
    slot_count: int


#: Up to this many accounting slots outside the survivors, their streams are subtracted
#: from the running total one at a time (~0.1 µs each) instead of gathering and summing
#: the survivors' (~1.5 µs).
STREAMS_OUTSIDE_MAX = 8


class Batch:
    """One decision's working data: the request, the model's index, per-candidate loads.

    Loads are copies of the agent's charges, taken when first read. Derived arrays are
    computed on first use and shared by every plugin of the decision.
    """

    __slots__ = (
        "_groups",
        "_kv_free",
        "_kv_own",
        "_matched",
        "_matches",
        "_pending",
        "_prefilling",
        "_queued",
        "_rate_sum",
        "_streams",
        "_streams_hint",
        "_survivors",
        "_uncached",
        "alive",
        "all_alive",
        "index",
        "memo",
        "request",
        "view",
    )

    def __init__(
        self,
        request: ZoneRequest,
        view: ZoneView,
        index: ModelIndex,
        survivors: tuple[Bools, Ints, bool] | None = None,
        streams_hint: StreamsHint | None = None,
    ) -> None:
        """``survivors``: the alive mask, its positions and whether nothing was removed,
        when the filters already ran (the batch is then sealed; the mask is read-only);
        ``streams_hint``: where their streams are in the accounting, when known."""
        self.request = request
        self.view = view
        self.index = index
        self._survivors: Ints | None
        if survivors is None:
            self.alive: Bools = index.all_true.copy()
            #: True while no filter removed anything (plugins may skip masking then).
            self.all_alive = True
            self._survivors = None
        else:
            self.alive, self._survivors, self.all_alive = survivors
        self._streams_hint = streams_hint
        #: Arrays a plugin computed for this decision, for the others (e.g. TTFT costs,
        #: used by the scorer and the cost model).
        self.memo: dict[str, Floats] = {}
        self._pending: Floats | None = None
        self._streams: Floats | None = None
        self._kv_own: Floats | None = None
        self._prefilling: Floats | None = None
        self._matched: Floats | None = None
        self._matches: dict[int, int] | None = None
        self._groups: list[tuple[int, int]] | object | None = _UNSET
        self._uncached: Floats | None = None
        self._queued: Floats | None = None
        self._kv_free: Floats | None = None
        self._rate_sum: float | None = None

    def __len__(self) -> int:
        return len(self.index.ids)

    @property
    def pending(self) -> Floats:
        """Our uncached prompt tokens in flight and not yet prefilled, per candidate."""
        if self._pending is None:
            self._pending = self.view.accounting.pending[self.index.slots]
        return self._pending

    @property
    def streams(self) -> Floats:
        """Our sequences in flight, per candidate."""
        if self._streams is None:
            self._streams = self.view.accounting.streams[self.index.slots]
        return self._streams

    @property
    def kv_own(self) -> Floats:
        if self._kv_own is None:
            self._kv_own = self.view.accounting.kv_blocks[self.index.slots]
        return self._kv_own

    @property
    def prefilling(self) -> Floats:
        if self._prefilling is None:
            self._prefilling = self.view.accounting.prefilling[self.index.slots]
        return self._prefilling

    @property
    def matches(self) -> Mapping[int, int]:
        """Position → leading prefix blocks of the request it recently got from us, for
        the candidates holding at least one (usually none or a few: kept sparse)."""
        if self._matches is None:
            groups = self.match_groups
            if groups is not None:
                # PrefixIndex.match's order: shallowest first, lowest position first.
                self._matches = {}
                for depth, mask in groups:
                    self._matches.update(dict.fromkeys(set_bits(mask), depth))
            elif self.request.prefix_hashes:
                hits = self.view.accounting.prefix.match(self.request.prefix_hashes)
                where = self.index.position_of_slot.get
                self._matches = {
                    position: blocks
                    for slot, blocks in hits.items()
                    if (position := where(slot)) is not None
                }
            else:
                self._matches = {}
        return self._matches

    @property
    def match_groups(self) -> list[tuple[int, int]] | None:
        """:attr:`matches` by depth — (leading blocks, mask of the positions holding
        exactly that many), shallowest first — when the slots are the positions
        (``ModelIndex.dense_slots``), else None. A prompt hundreds of GPUs hold part of
        (a large zone's system prompt) costs a few big-integer operations, not a dict
        entry per GPU."""
        if self._groups is _UNSET:
            groups: list[tuple[int, int]] | None = None
            if self.index.dense_slots:
                groups = []
                hashes = self.request.prefix_hashes
                if hashes:
                    # Slots past the candidates' are retired GPUs' (not candidates).
                    candidates = (1 << len(self.index.ids)) - 1
                    for depth, mask in self.view.accounting.prefix.match_groups(hashes):
                        mask &= candidates
                        if mask:
                            groups.append((depth, mask))
            self._groups = groups
        return cast("list[tuple[int, int]] | None", self._groups)

    def blocks_at(self, position: int) -> int:
        """``matches.get(position, 0)`` without building the dict."""
        if self._matches is None:
            groups = self.match_groups
            if groups is not None:
                bit = 1 << position
                for depth, mask in groups:
                    if mask & bit:
                        return depth
                return 0
        return self.matches.get(position, 0)

    @property
    def any_match(self) -> bool:
        """Whether any candidate holds a leading block of the prompt."""
        groups = self.match_groups
        return bool(groups) if groups is not None else bool(self.matches)

    @property
    def matched(self) -> Floats:
        """Leading prefix blocks of the request each candidate recently got from us."""
        if self._matched is None:
            matches = self.matches
            if not matches:
                self._matched = self.index.zeros  # shared, read-only
            else:
                count = len(matches)
                self._matched = np.zeros(len(self.index.ids))
                self._matched[np.fromiter(matches, np.intp, count)] = np.fromiter(
                    matches.values(), np.float64, count
                )
        return self._matched

    def uncached_tokens(self, blocks: int) -> float:
        """Prompt tokens left to prefill at a GPU holding the first ``blocks`` blocks
        (the scalar form of :attr:`uncached`, the same float operations)."""
        request = self.request
        return max(0.0, request.input_tokens - blocks * request.tokens_per_block)

    @property
    def uncached(self) -> Floats:
        """This request's prompt tokens each candidate still has to prefill."""
        if self._uncached is None:
            request = self.request
            if self.matches:
                saved = self.matched * request.tokens_per_block
                self._uncached = np.maximum(0.0, request.input_tokens - saved)
            else:
                self._uncached = self.index.zeros + float(request.input_tokens)
        return self._uncached

    def uncached_at(self, position: int) -> float:
        """``uncached[position]`` without building the array."""
        blocks = self.blocks_at(position)
        if not blocks:
            return float(self.request.input_tokens)
        return self.uncached_tokens(blocks)

    @property
    def survivors(self) -> Ints:
        """Positions of the alive candidates, ascending (fixed once the filters ran)."""
        if self._survivors is not None:
            return self._survivors
        return self.alive.nonzero()[0]

    def seal(self) -> None:
        """The filters are done: ``alive`` no longer changes, so cache ``survivors``."""
        self._survivors = self.alive.nonzero()[0]

    @property
    def queued(self) -> Floats:
        """Uncached prompt tokens already waiting at each candidate (ours + others')."""
        if self._queued is None:
            self._queued = self.pending + self.index.external_queued
        return self._queued

    @property
    def rate_sum(self) -> float:
        """Sum of the survivors' prefill rates (tokens/s)."""
        if self._rate_sum is None:
            index = self.index
            if self.all_alive:
                self._rate_sum = index.rate_sum
            else:
                self._rate_sum = float(np.dot(index.rate, self.alive))
        return self._rate_sum

    def streams_sum(self) -> float:
        """Our sequences in flight over the survivors. (Counts of sequences are whole
        numbers, so every order of summation gives this same float.)"""
        hint = self._streams_hint
        if hint is not None:
            acc = self.view.accounting
            if hint.outside is not None and acc.slot_count == hint.slot_count:
                # The running total minus the few slots that are not survivors.
                total, at = acc.streams_total, acc.streams.item
                for slot in hint.outside:
                    total -= at(slot)
                return total
            # One gather from the accounting instead of two (all slots, then survivors).
            return float(np.add.reduce(acc.streams[hint.slots]))
        streams = self.streams
        if self.all_alive:
            return float(np.add.reduce(streams))
        return float(np.add.reduce(streams[self.survivors]))

    @property
    def kv_free(self) -> Floats:
        """Free KV blocks: the last fresh scrape minus what we sent since, else capacity
        minus our own charge. (Never below ``kv_free_base − kv_own``: our charge is a
        sum of whole blocks, never negative, so what we sent since is at most all of it
        — the free-KV rule's cheap test.)"""
        if self._kv_free is None:
            index = self.index
            self._kv_free = free_blocks(self.kv_own, index.kv_own_base, index.kv_free_base)
        return self._kv_free

    def rng(self, seed: int) -> random.Random:
        """Per-request random source: ``random.Random(f"{seed}:{request_id}")``, the
        derivation of :func:`gtm.routing.framework.request_rng`."""
        return random.Random(f"{seed}:{self.request.request_id}")


# ---------------------------------------------------------------------------- plugins


class Removal(NamedTuple):
    """What a filter removes (a mask over all candidates) and why, lazily per candidate.

    (A NamedTuple, as :class:`ZoneDecision`: built in C, a few per decision.)
    """

    mask: Bools
    reason: Callable[[int], str]


@runtime_checkable
class GpuFilter(Protocol):
    @property
    def name(self) -> str: ...

    def removes(self, batch: Batch, /) -> Removal | None:
        """Candidates to remove (only alive ones count); None removes nothing."""
        ...


@runtime_checkable
class GpuScorer(Protocol):
    @property
    def name(self) -> str: ...

    def scores(self, batch: Batch, /) -> Floats:
        """A score in [0, 1] per candidate (values of removed candidates are ignored)."""
        ...


@runtime_checkable
class GpuPicker(Protocol):
    @property
    def name(self) -> str: ...

    def pick(self, batch: Batch, totals: Floats, /) -> int:
        """A position among ``batch.alive`` (never called with none alive)."""
        ...


@runtime_checkable
class GpuCostModel(Protocol):
    @property
    def name(self) -> str: ...

    def costs_ms(self, batch: Batch, /) -> Floats:
        """Predicted TTFT of the request at each candidate, in ms (inf: cannot serve)."""
        ...


# ---------------------------------------------------------------------------- fused filters


class _IndexFilter(Protocol):
    """A filter whose removal, when no GPU is half-open, depends on the view alone."""

    @property
    def name(self) -> str: ...

    def index_removal(self, index: ModelIndex, /) -> Removal | None: ...


class _FitsRole(Protocol):
    @property
    def name(self) -> str: ...

    def shortcut(self, request: ZoneRequest, index: ModelIndex, /) -> object | None: ...

    def soft_removal(self, batch: Batch, need: Any, /) -> Removal | None: ...


class _CanaryRole(Protocol):
    @property
    def name(self) -> str: ...

    def idle(self, request: ZoneRequest, index: ModelIndex, /) -> bool: ...


class _Prepared(NamedTuple):
    """The fused filters' work that depends on the view alone (cached on the index)."""

    alive: Bools
    survivors: Ints
    all_alive: bool
    #: The healthy and serves-model steps; then all steps when nothing else removes.
    steps: tuple[_Step, ...]
    idle_steps: tuple[_Step, ...]
    #: :attr:`Batch.rate_sum` of ``alive``.
    rate_sum: float
    streams_hint: StreamsHint


_UNPREPARED = object()


class FusedFilters:
    """The default filter chain — healthy, serves-model, fits, optionally canary — as
    one step, for the usual request (:meth:`ZoneProfile.decide` falls back to running
    the filters one by one for any other).

    ``healthy-filter`` and ``serves-model-filter`` depend on the view alone when no GPU
    is half-open, so their survivors and trace steps are worked out once per view and
    model (cached in :attr:`ModelIndex.memo`), not once per request. ``fits-filter``
    needs per-GPU work only for its free-KV rule (its scalar shortcut says when), and
    ``canary-filter`` removes nothing when no GPU is a canary and the request pins
    nothing. Each calls the plugin's own code, so the survivors, the steps and their
    reasons are those of the one-by-one run (``tests/property``, ``tests/unit`` check).
    """

    def __init__(
        self,
        healthy: _IndexFilter,
        serves: _IndexFilter,
        fits: _FitsRole,
        canary: _CanaryRole | None,
    ) -> None:
        self._index_filters = (healthy, serves)
        self._fits = fits
        self._canary = canary
        self._canary_step: tuple[_Step, ...] = ()
        if canary is not None:
            self._canary_step = (_Step(canary.name, None, _ALREADY_TRIED),)
        self._tail = (_Step(fits.name, None, _ALREADY_TRIED), *self._canary_step)

    @classmethod
    def of(cls, filters: Sequence[GpuFilter]) -> FusedFilters | None:
        """The fused form of ``filters``, or None when they are not the default chain."""
        roles = [getattr(f, "fused_role", None) for f in filters]
        if roles[:3] != ["healthy", "serves-model", "fits"] or roles[3:] not in ([], ["canary"]):
            return None
        healthy, serves, fits = (cast(Any, f) for f in filters[:3])
        return cls(healthy, serves, fits, cast(Any, filters[3]) if len(filters) > 3 else None)

    def run(
        self, request: ZoneRequest, view: ZoneView, index: ModelIndex
    ) -> tuple[Batch, tuple[_Step, ...]] | None:
        """The filtered batch and its steps, or None: run the filters one by one."""
        prepared = index.memo.get(self, _UNPREPARED)
        if prepared is _UNPREPARED:
            prepared = index.memo[self] = self._prepare(index, view.accounting)
        if prepared is None:
            return None
        assert isinstance(prepared, _Prepared)
        canary = self._canary
        if canary is not None and not canary.idle(request, index):
            return None
        need = self._fits.shortcut(request, index)
        if need is None:
            return None
        batch = Batch(request, view, index, prepared[:3], prepared.streams_hint)
        removal = self._fits.soft_removal(batch, need)
        if removal is None:
            batch._rate_sum = prepared.rate_sum
            return batch, prepared.idle_steps
        # The free-KV rule removes only when some survivor has room: never all.
        alive = np.greater(prepared.alive, removal.mask)
        batch.alive, batch.all_alive, batch._streams_hint = alive, False, None
        batch.seal()
        step = _Step(self._fits.name, removal.mask, removal.reason)
        return batch, (*prepared.steps, step, *self._canary_step)

    def _prepare(self, index: ModelIndex, accounting: Accounting) -> _Prepared | None:
        if index.any_half_open:
            return None  # the healthy filter then depends on our in-flight streams
        alive = index.all_true
        steps: list[_Step] = []
        for plugin in self._index_filters:
            removal = plugin.index_removal(index)
            if removal is None:
                steps.append(_Step(plugin.name, None, _ALREADY_TRIED))
                continue
            alive = np.greater(alive, removal.mask)
            steps.append(_Step(plugin.name, removal.mask, removal.reason))
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
        return _Prepared(
            alive,
            survivors,
            all_alive,
            tuple(steps),
            (*steps, *self._tail),
            rate_sum,
            hint,
        )


class _CostScorer(Protocol):
    scale_ms: float

    def costs_ms(self, batch: Batch, /) -> Floats: ...

    def scores(self, batch: Batch, /) -> Floats: ...


class CheapestPick:
    """A lone cost scorer (``ttft-cost``) under the plain ``max-score-picker``: the
    choice is the survivor of lowest cost, found without working out the scores.

    The scorer scores ``exp(-(cost - best) / scale)``: 1 for the cheapest and strictly
    less for anything that costs more — except that exp of a tiny negative number
    rounds to 1, so a survivor costing a hair more than the best ties with it, and the
    picker takes the first of the tied. Only when a second survivor costs more than the
    best but within ``1e-9 × scale`` of it (where exp may round to 1; it surely does not
    below ``-1e-9``) are the scores worked out to pick, so the choice is always the
    picker's. (Survivors costing exactly the best tie at 1: argmin finds the first.)
    The scores themselves are worked out only for a trace (:attr:`ZoneDecision.scores`).
    """

    #: Costs this close to the best (in units of the scorer's scale) may tie with it.
    NEAR = 1e-9

    def __init__(self, scorer: _CostScorer) -> None:
        self._scorer = scorer
        self._margin = self.NEAR * scorer.scale_ms

    @classmethod
    def of(cls, scorers: Sequence[WeightedGpuScorer], picker: GpuPicker) -> CheapestPick | None:
        if len(scorers) != 1 or not getattr(picker, "picks_max_total", False):
            return None
        scorer = scorers[0].scorer
        if getattr(scorer, "fused_role", None) != "cost-score":
            return None
        return cls(cast(Any, scorer))

    def choose(self, batch: Batch) -> int:
        """The position to choose, or -1: work the scores out and let the picker pick."""
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
    """A cost scorer (``ttft-cost``) then ``kv-cache-utilization-scorer`` under the plain
    ``max-score-picker`` — the default profile: the weighted sum and the pick of
    :mod:`zone_agent.costs.blend` in one call (its C kernel when built), so the choice is
    the runner's, without the per-scorer dispatch and the scores record (a trace works
    them out when asked). On a near tie the kernel answers -1 and the numpy form decides.
    """

    def __init__(
        self,
        cost: GpuScorer,
        cost_weight: float,
        room: GpuScorer,
        room_weight: float,
        *,
        kernel: bool = True,
    ) -> None:
        self._cost = cast(_CostScorer, cost)
        self._cost_weight, self._room_weight = cost_weight, room_weight
        weight_sum = cost_weight + room_weight
        # Dividing by a power of two is exact and keeps every order and tie: skipped (0).
        self._div = 0.0 if math.frexp(weight_sum)[0] == 0.5 else weight_sum
        self._inv_scale = 1.0 / self._cost.scale_ms
        #: The C kernel, when it was built and ``kernel`` is set.
        self._kernel = blend.blend_choice if kernel else None

    @classmethod
    def of(cls, scorers: Sequence[WeightedGpuScorer], picker: GpuPicker) -> BlendPick | None:
        if len(scorers) != 2 or not getattr(picker, "picks_max_total", False):
            return None
        cost, room = scorers
        if getattr(cost.scorer, "fused_role", None) != "cost-score":
            return None
        if getattr(room.scorer, "fused_role", None) != "kv-room":
            return None
        return cls(cost.scorer, float(cost.weight), room.scorer, float(room.weight))

    def choose(self, batch: Batch) -> int:
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
        kernel = self._kernel
        if kernel is not None:
            choice = kernel(*args)
            if choice >= 0:
                return int(choice)
        return blend.blend_choice_numpy(*args)


# ---------------------------------------------------------------------------- decisions


class _Step(NamedTuple):
    plugin: str
    #: The filter's mask (it may name candidates already removed); None: removed nothing.
    removed: Bools | None
    reason: Callable[[int], str]


class Scored(NamedTuple):
    totals: Floats
    columns: tuple[tuple[str, Floats], ...]


class ZoneDecision(NamedTuple):
    """A decision: the chosen GPU and everything needed to explain it on demand.

    (A NamedTuple: immutable, and built in C — a frozen dataclass of this size costs
    ~4 µs to construct, a tenth of a whole decision.)
    """

    profile: str
    request: ZoneRequest
    model_index: ModelIndex
    choice: int
    gpu: GpuState
    predicted_ttft_ms: float | None
    uncached_tokens: float
    matched_blocks: int
    steps: tuple[_Step, ...]
    #: The scores when the decision needed them; else None, and :attr:`scores` and
    #: :attr:`totals` are worked out when asked for (a trace), by ``rescore``.
    scored: Scored | None
    alive: Bools
    weights: tuple[tuple[str, float], ...]
    picker: str
    duration_s: float = 0.0
    rescore: Callable[[], Scored] | None = None

    @property
    def gpu_id(self) -> str:
        return self.model_index.ids[self.choice]

    @property
    def totals(self) -> Floats:
        """Each candidate's weighted total score (values of removed ones are ignored)."""
        return self._scored().totals

    @property
    def scores(self) -> tuple[tuple[str, Floats], ...]:
        """Each scorer's name and scores."""
        return self._scored().columns

    def _scored(self) -> Scored:
        if self.scored is not None:
            return self.scored
        assert self.rescore is not None
        return self.rescore()

    def to_decision(self, top: int | None = 16) -> Decision:
        """The decision as a :class:`gtm.models.Decision` (scores of the ``top`` best
        survivors and always the choice; None: all)."""
        scored = self._scored()  # once: without eager scores, each access works them out
        totals = scored.totals
        alive = np.flatnonzero(self.alive)
        if top is not None and len(alive) > top:
            best = alive[np.argsort(-totals[alive], kind="stable")[:top]]
            keep = sorted({int(i) for i in best} | {self.choice})
        else:
            keep = [int(i) for i in alive]
        ids = self.model_index.ids
        scores = tuple(
            CandidateScore(
                candidate=ids[i],
                scores=tuple((name, float(column[i])) for name, column in scored.columns),
                total=float(totals[i]),
            )
            for i in keep
        )
        trace = DecisionTrace(
            profile=self.profile,
            candidates=ids,
            filters=_filter_steps(self.steps, ids),
            scores=scores,
            picker=self.picker,
            weights=self.weights,
            scores_omitted=len(alive) - len(keep),
        )
        return Decision(
            request_id=self.request.request_id,
            tier=Tier.ZONE,
            choice=self.gpu_id,
            trace=trace,
            predicted_ttft_ms=self.predicted_ttft_ms,
        )


def _filter_steps(steps: Sequence[_Step], ids: tuple[str, ...]) -> tuple[FilterStep, ...]:
    """Trace records of the filter steps; each step's mask counts only the candidates
    still alive before it (the runner keeps the raw masks)."""
    out: list[FilterStep] = []
    alive = np.ones(len(ids), dtype=np.bool_)
    for step in steps:
        if step.removed is None:
            removed: list[int] = []
        else:
            hit = step.removed & alive
            alive &= ~step.removed
            removed = [int(i) for i in np.flatnonzero(hit)]
        out.append(
            FilterStep(
                plugin=step.plugin,
                removed=tuple(ids[i] for i in removed),
                reasons=tuple((ids[i], step.reason(i)) for i in removed),
                remaining=int(alive.sum()),
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------- profile


_NO_OBSERVERS: Mapping[str, Callable[[float], None]] = MappingProxyType({})


def _failed(point: ExtensionPoint, name: str, exc: Exception) -> PluginError:
    return PluginError(f"{point} plugin {name!r} failed: {type(exc).__name__}: {exc}")


def _already_tried(position: int) -> str:
    return "already tried by this request"


_ALREADY_TRIED = _already_tried


@dataclass(frozen=True, slots=True)
class WeightedGpuScorer:
    scorer: GpuScorer
    weight: float


class ZoneProfile:
    """A zone routing profile: filters, weighted scorers, one picker, an optional cost model."""

    def __init__(
        self,
        name: str,
        filters: Sequence[GpuFilter],
        scorers: Sequence[WeightedGpuScorer],
        picker: GpuPicker,
        *,
        cost_model: GpuCostModel | None = None,
        metrics: RoutingMetrics | None = None,
        timer: Callable[[], float] = time.perf_counter,
        plugin_timing_every: int = 16,
        fast_paths: bool = True,
    ) -> None:
        """``fast_paths=False`` runs every decision through the plugins one by one
        (:class:`FusedFilters` and :class:`CheapestPick` off): the reference the fast
        paths are tested and benchmarked against."""
        if not name:
            raise PluginError("a profile needs a name")
        for ws in scorers:
            if not (ws.weight > 0.0 and math.isfinite(ws.weight)):
                raise PluginError(
                    f"scorer {ws.scorer.name!r}: weight must be > 0, got {ws.weight!r}"
                )
        names = [f.name for f in filters] + [ws.scorer.name for ws in scorers]
        if len(set(names)) != len(names):
            raise PluginError(f"profile {name!r}: plugin names must be unique: {names}")
        if not filters or not getattr(filters[0], "ensures_health", False):
            raise PluginError(
                f"profile {name!r}: the first filter must be a healthy-filter "
                "(no profile may route to an ejected, draining or unchecked GPU)"
            )
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self.cost_model = cost_model
        self.weights = tuple((ws.scorer.name, float(ws.weight)) for ws in scorers)
        self._weight_sum = sum(w for _, w in self.weights)
        self._timer = timer
        if plugin_timing_every < 1:
            raise PluginError("plugin_timing_every must be >= 1")
        # Per-plugin latency is sampled (one decision in N), as the generic runner does:
        # a histogram observation costs about as much as a cheap plugin.
        self._timing_every = plugin_timing_every
        self._decisions = 0
        self._observe = self._observers(metrics)
        self._decision_obs = (
            None if metrics is None else metrics.decision_duration.labels(Tier.ZONE, name).observe
        )
        self._metrics = metrics
        self._fused = FusedFilters.of(self.filters) if fast_paths else None
        self._cheapest = CheapestPick.of(self.scorers, self.picker) if fast_paths else None
        self._blend = BlendPick.of(self.scorers, self.picker) if fast_paths else None
        self._scorers_in_range = tuple(
            (ws, bool(getattr(ws.scorer, "scores_in_range", False))) for ws in self.scorers
        )

    def _observers(self, metrics: RoutingMetrics | None) -> dict[str, Callable[[float], None]]:
        if metrics is None:
            return {}
        histogram = metrics.plugin_duration
        out: dict[str, Callable[[float], None]] = {
            f.name: histogram.labels(Tier.ZONE, ExtensionPoint.FILTER, f.name).observe
            for f in self.filters
        }
        for ws in self.scorers:
            out[ws.scorer.name] = histogram.labels(
                Tier.ZONE, ExtensionPoint.SCORER, ws.scorer.name
            ).observe
        out[self.picker.name] = histogram.labels(
            Tier.ZONE, ExtensionPoint.PICKER, self.picker.name
        ).observe
        if self.cost_model is not None:
            name = self.cost_model.name
            out[_COST_KEY] = histogram.labels(Tier.ZONE, ExtensionPoint.COST_MODEL, name).observe
        return out

    def without_fast_paths(self) -> ZoneProfile:
        """The same profile (the same plugin objects) deciding with the reference runner."""
        return ZoneProfile(
            self.name,
            self.filters,
            self.scorers,
            self.picker,
            cost_model=self.cost_model,
            metrics=self._metrics,
            timer=self._timer,
            plugin_timing_every=self._timing_every,
            fast_paths=False,
        )

    def decide(
        self, request: ZoneRequest, view: ZoneView, *, exclude: frozenset[str] = frozenset()
    ) -> ZoneDecision:
        """Choose a GPU for ``request``.

        Raises:
            ModelNotServed: no GPU of the zone serves the model.
            NoEligibleCandidate: a filter removed every candidate (``filter_name`` says which;
                ``trace`` holds the steps up to there).
            PluginError: a plugin raised something that is not a GtmError.
        """
        timer = self._timer
        started = timer()
        index = view.by_model.get(request.model)
        if index is None or not index.ids:
            raise ModelNotServed(request.model)
        self._decisions += 1
        observe = self._observe if self._decisions % self._timing_every == 0 else _NO_OBSERVERS
        # Decisions whose plugins are timed run the filters one by one, so that each
        # filter's histogram times that filter.
        fused = None
        if self._fused is not None and not exclude and not observe:
            fused = self._fused.run(request, view, index)
        if fused is None:
            batch, steps = self._filter(request, view, index, exclude, observe)
        else:
            batch, steps = fused
        alive = batch.alive
        scored: Scored | None = None
        choice = -1
        if self._cheapest is not None and not observe:
            choice = self._cheapest.choose(batch)
        elif self._blend is not None and not observe:
            choice = self._blend.choose(batch)
        if choice < 0:
            scored = self._score(batch, observe)
            choice = self._pick(batch, scored.totals, observe)
        predicted = self._predict(batch, choice, observe)
        duration = timer() - started
        if self._decision_obs is not None:
            self._decision_obs(duration)
        # Positional: the NamedTuple's __new__ binds them without a keyword dict.
        return ZoneDecision(
            self.name,
            request,
            index,
            choice,
            view.gpus[index.positions.item(choice)],
            predicted,
            batch.uncached_at(choice),
            batch.blocks_at(choice),
            steps,
            scored,
            alive,
            self.weights,
            self.picker.name,
            duration,
            None if scored is not None else partial(self._score, batch, _NO_OBSERVERS),
        )

    def _pick(
        self, batch: Batch, totals: Floats, observe: Mapping[str, Callable[[float], None]]
    ) -> int:
        timer = self._timer
        t0 = timer() if observe else 0.0
        try:
            choice = self.picker.pick(batch, totals)
        except GtmError:
            raise
        except Exception as exc:
            raise _failed(ExtensionPoint.PICKER, self.picker.name, exc) from exc
        if observe:
            observe[self.picker.name](timer() - t0)
        if not (0 <= choice < len(batch.index.ids)) or not batch.alive[choice]:
            raise PluginError(
                f"picker {self.picker.name!r} chose position {choice}, which is not a survivor"
            )
        return choice

    def _filter(
        self,
        request: ZoneRequest,
        view: ZoneView,
        index: ModelIndex,
        exclude: frozenset[str],
        observe: Mapping[str, Callable[[float], None]],
    ) -> tuple[Batch, tuple[_Step, ...]]:
        """Run the filters one by one (the reference runner)."""
        timer = self._timer
        batch = Batch(request, view, index)
        alive = batch.alive
        steps: list[_Step] = []
        if exclude:
            tried = np.array([gid in exclude for gid in index.ids], dtype=np.bool_)
            alive &= ~tried
            batch.all_alive = False
            steps.append(_Step(RETRY_STEP, tried, _ALREADY_TRIED))
            if not fany(alive):
                self._refuse(RETRY_STEP, index, steps)
        for plugin in self.filters:
            t0 = timer() if observe else 0.0
            try:
                removal = plugin.removes(batch)
            except GtmError:
                raise
            except Exception as exc:
                raise _failed(ExtensionPoint.FILTER, plugin.name, exc) from exc
            if observe:
                observe[plugin.name](timer() - t0)
            if removal is None:
                steps.append(_Step(plugin.name, None, _ALREADY_TRIED))
                continue
            # Survivors: alive AND NOT mask, in place (for booleans a > b is a & ~b).
            # What this step removed is worked out from the masks only for a trace.
            np.greater(alive, removal.mask, out=alive)
            batch.all_alive = False
            steps.append(_Step(plugin.name, removal.mask, removal.reason))
            if not fany(alive):
                self._refuse(plugin.name, index, steps)
        batch.seal()
        return batch, tuple(steps)

    def _score(self, batch: Batch, observe: Mapping[str, Callable[[float], None]]) -> Scored:
        scores: list[tuple[str, Floats]] = []
        totals: Floats | None = None
        for ws, in_range in self._scorers_in_range:
            t0 = self._timer() if observe else 0.0
            try:
                column = ws.scorer.scores(batch)
            except GtmError:
                raise
            except Exception as exc:
                raise _failed(ExtensionPoint.SCORER, ws.scorer.name, exc) from exc
            if observe:
                observe[ws.scorer.name](self._timer() - t0)
            # One reduction each: NaN fails both comparisons, so only a broken scorer
            # pays for the repair (clamp to [0, 1], NaN → 0), as the generic runner does.
            # Scorers whose values are in range by construction say so and skip it.
            if not in_range and not (fmin(column) >= 0.0 and fmax(column) <= 1.0):
                column = np.clip(np.nan_to_num(column, nan=0.0), 0.0, 1.0)
            scores.append((ws.scorer.name, column))
            if totals is None:
                # x · 1.0 is x exactly: a lone scorer of weight 1 needs no arithmetic.
                totals = column if ws.weight == 1.0 else column * ws.weight
            else:
                totals = totals + column * ws.weight
        if totals is None:
            return Scored(np.zeros(len(batch.index.ids)), ())
        if len(self.scorers) > 1 or self._weight_sum != 1.0:
            totals = totals / self._weight_sum
        return Scored(totals, tuple(scores))

    def _predict(
        self, batch: Batch, choice: int, observe: Mapping[str, Callable[[float], None]]
    ) -> float | None:
        model = self.cost_model
        if model is None:
            return None
        t0 = self._timer() if observe else 0.0
        try:
            costs = model.costs_ms(batch)
        except GtmError:
            raise
        except Exception as exc:
            raise _failed(ExtensionPoint.COST_MODEL, model.name, exc) from exc
        if observe:
            observe[_COST_KEY](self._timer() - t0)
        cost = costs.item(choice)  # a Python float, without a numpy scalar
        return cost if cost >= 0 and cost < math.inf else None

    def _refuse(self, filter_name: str, index: ModelIndex, steps: Sequence[_Step]) -> NoReturn:
        if self._metrics is not None:
            self._metrics.no_eligible.labels(Tier.ZONE, self.name, filter_name).inc()
        trace = DecisionTrace(
            profile=self.name,
            candidates=index.ids,
            filters=_filter_steps(steps, index.ids),
            picker=self.picker.name,
            weights=self.weights,
        )
        last = trace.filters[-1] if trace.filters else None
        why = f"e.g. {last.reasons[0][0]!r}: {last.reasons[0][1]}" if last and last.reasons else ""
        raise NoEligibleCandidate(filter_name, why, trace=trace)

"""The zone as one decision sees it: an immutable view, indexed by model.

:class:`ZoneView` is rebuilt after every scrape round, health change or inventory change
and swapped in with one reference assignment (as :class:`gtm.state.snapshot.FleetSnapshot`
is). It merges, per GPU: the inventory record, the last scrape (with its age), the
health status and the GPU's performance profile. Decisions do not loop over GPU objects:
each model has a :class:`ModelIndex`, the GPUs that serve it, with every per-GPU number a
decision needs as a numpy array, so a decision over 1,000 GPUs is a few vector
operations.

Signals carry their age. A scrape older than ``stale_after_s`` is *distrusted*: its
queue, batch and KV numbers are ignored and the GPU is priced from its profile and the
agent's own in-flight accounting alone (which is always current).

The only per-decision inputs not in the view are the agent's in-flight charges
(:class:`~zone_agent.accounting.Accounting`, read with one fancy index per array when a
decision starts — a copy, so the decision sees a consistent snapshot) and the prefix
index lookup for the request's blocks.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gtm.gpu_profiles import GpuProfile, ProfileCatalog, ProfileSource, shipped
from gtm.models import GpuWorker, WorkerState
from zone_agent.accounting import Accounting, SlotLoad
from zone_agent.calibration import Priced, prior_profile
from zone_agent.health import HealthStatus
from zone_agent.prefix import BLOCK_BYTES
from zone_agent.prompt_sizes import tokens_per_request
from zone_agent.scrape import GpuMetrics, ModelMetrics

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

#: Virtual nodes per GPU on the consistent-hash ring (the vLLM router's
#: ``consistent_hash`` uses 160, as ketama does).
RING_VNODES = 160

#: Label marking a canary GPU, and the label naming a GPU's version.
CANARY_LABEL = "canary"
VERSION_LABEL = "version"

#: Bytes of English text per token (OpenAI's "~4 characters per token"), to size the
#: prefix index of a GPU in 256-byte blocks from its KV capacity in tokens.
BYTES_PER_TOKEN = 4


#: What a view prices one GPU's model by: (GPU id, GPU type, model, now) → profile and
#: its source. The zone agent's is its :class:`zone_agent.calibration.Calibrator`.
Pricing = Callable[[str, str, str, float], Priced]


def static_priced(catalog: ProfileCatalog, gpu_type: str, model: str) -> Priced:
    """The pair's profile in ``catalog``, else the conservative prior (never calibrated)."""
    entry = catalog.entry(gpu_type, model)
    if entry is not None:
        return Priced(entry.profile, entry.source)
    return Priced(prior_profile(catalog, gpu_type, model).profile, ProfileSource.PRIOR)


def profile_for(gpu_type: str, model: str) -> GpuProfile:
    """The shipped profile of the pair, else the conservative prior (the slowest shipped
    profile of the model), with the KV geometry the worker reports taking precedence
    in the view. Never another GPU's figures silently: the prior is logged and exported
    by the zone agent's calibrator, which replaces it by measurements."""
    return static_priced(shipped(), gpu_type, model).profile


def static_pricing(catalog: ProfileCatalog | None = None) -> Pricing:
    """Pricing by profiles alone (no calibration): the simulator's and the tests'."""
    table = catalog

    def price(gpu_id: str, gpu_type: str, model: str, now: float) -> Priced:
        return static_priced(table if table is not None else shipped(), gpu_type, model)

    return price


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU of the zone: inventory, last scrape, health, drain."""

    worker: GpuWorker
    slot: int
    metrics: GpuMetrics | None = None
    #: The agent's own charges on this GPU when ``metrics`` was scraped.
    own_at_scrape: SlotLoad = field(default_factory=SlotLoad)
    health: HealthStatus = field(default_factory=lambda: HealthStatus(True))
    drained: bool = False
    #: Prompt tokens the worker computed per request lately, by the scrape's model label
    #: (:mod:`zone_agent.prompt_sizes`): what another client's waiting request weighs.
    prompt_tokens: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def id(self) -> str:
        return self.worker.id

    def unavailable_reason(self) -> str | None:
        """Why no request may go here now (None: it may)."""
        if self.drained:
            return "drained by an operator"
        state = self.worker.state
        if state is not WorkerState.READY:
            return f"worker is {state.value}"
        if not self.health.eligible:
            return self.health.reason or "unhealthy"
        return None


_A = TypeVar("_A", bound=np.ndarray)
_T = TypeVar("_T")


def _frozen(array: _A) -> _A:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ModelIndex:
    """The GPUs serving one model, ordered by id, with per-GPU arrays (read-only)."""

    model: str
    ids: tuple[str, ...]
    positions: Ints  # into ZoneView.gpus
    slots: Ints  # accounting slots
    profiles: tuple[GpuProfile, ...]
    #: Where each GPU's profile comes from (shipped, file, calibrated, prior).
    sources: tuple[ProfileSource, ...]
    #: Why a GPU may not take requests now (None: it may); ``available`` is the mask.
    reasons: tuple[str | None, ...]
    available: Bools
    half_open: Bools
    #: False where a fresh scrape shows the worker does not have the model loaded.
    loaded: Bools
    #: Effective prefill rate (profile × health weight), tokens/s; and the profile's.
    rate: Floats
    raw_rate: Floats
    weight: Floats
    #: The slow-start part of ``weight`` (:attr:`HealthStatus.ramp`): costs × ramp are
    #: predictions without the ramp's preference.
    ramp: Floats
    max_model_len: Floats
    block_size: Floats
    kv_total: Floats
    #: Free KV blocks at the last fresh scrape (NaN: unknown), and the agent's own KV
    #: charge then, to correct for what it sent since.
    kv_free_scraped: Floats
    own_kv_at_scrape: Floats
    #: The agent's own requests not yet started at scrape time (its share of ``waiting``).
    own_prefilling_at_scrape: Floats
    max_seqs: Floats
    max_batched: Floats
    #: Queued prompt tokens of *other* clients seen in a fresh scrape (estimate).
    external_queued: Floats
    running: Floats
    waiting: Floats
    kv_usage: Floats
    fresh: Bools
    #: Extra time per prefill pass from the running batch (decode pressure), seconds.
    step_extra_s: Floats
    #: Prefix blocks (of BLOCK_BYTES) the GPU's KV cache can hold.
    prefix_capacity: Ints
    canary: Bools
    versions: tuple[str | None, ...]
    #: Integer weights by GPU type for weighted round robin (prefill rate / slowest).
    wrr_weight: Ints
    ring_points: npt.NDArray[np.uint64]
    ring_owner: Ints
    position_of_slot: Mapping[int, int]
    # Derived in __post_init__, so that decisions find them ready-made.
    unavailable: Bools = field(init=False)
    any_unavailable: bool = field(init=False)
    any_half_open: bool = field(init=False)
    all_loaded: bool = field(init=False)
    any_canary: bool = field(init=False)
    min_max_model_len: float = field(init=False)
    min_kv_total: float = field(init=False)
    #: 1000 / rate (inf where nothing can be prefilled): ms per uncached prompt token.
    ms_per_token: Floats = field(init=False)
    inv_max_batched: Floats = field(init=False)
    #: 1 / max(kv_total, 1): KV room as a product (kv-cache-utilization-scorer).
    inv_kv_total: Floats = field(init=False)
    step_extra_ms: Floats = field(init=False)
    #: Free KV blocks = max(0, kv_free_base − max(0, own KV charge − kv_own_base)).
    kv_free_base: Floats = field(init=False)
    kv_own_base: Floats = field(init=False)
    #: Sum of ``rate`` over every candidate.
    rate_sum: float = field(init=False)
    #: All True (copied as each decision's survivor mask); all 0.0.
    all_true: Bools = field(init=False)
    zeros: Floats = field(init=False)
    #: The block size when every GPU of the model has the same one (else 0).
    uniform_block_size: float = field(init=False)
    #: min(kv_free_base): free blocks ≥ this minus our largest charge, everywhere.
    min_kv_free_bound: float = field(init=False)
    #: Whether the candidate at position i has accounting slot i, for every i (the
    #: usual case: GPUs get slots in id order): positions then need no lookup.
    dense_slots: bool = field(init=False)
    #: What decisions work out once per view (e.g. the fused filters' survivors), keyed
    #: by whoever computed it. Filled lazily; the arrays in it are read-only.
    memo: dict[object, object] = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        unknown = np.isnan(self.kv_free_scraped)
        derived = {
            "unavailable": _frozen(~self.available),
            "any_unavailable": not bool(self.available.all()),
            "any_half_open": bool(self.half_open.any()),
            "all_loaded": bool(self.loaded.all()),
            "any_canary": bool(self.canary.any()),
            "min_max_model_len": float(self.max_model_len.min()),
            "min_kv_total": float(self.kv_total.min()),
            "ms_per_token": _frozen(
                np.divide(
                    1000.0, self.rate, out=np.full(len(self.rate), np.inf), where=self.rate > 0
                )
            ),
            "inv_max_batched": _frozen(1.0 / np.maximum(self.max_batched, 1.0)),
            "inv_kv_total": _frozen(1.0 / np.maximum(self.kv_total, 1.0)),
            "step_extra_ms": _frozen(1000.0 * self.step_extra_s),
            "kv_free_base": _frozen(np.where(unknown, self.kv_total, self.kv_free_scraped)),
            "kv_own_base": _frozen(np.where(unknown, 0.0, self.own_kv_at_scrape)),
        }
        derived["rate_sum"] = float(self.rate.sum())
        derived["all_true"] = _frozen(np.ones(len(self.ids), dtype=np.bool_))
        derived["zeros"] = _frozen(np.zeros(len(self.ids)))
        sizes = set(self.block_size.tolist())
        derived["uniform_block_size"] = float(sizes.pop()) if len(sizes) == 1 else 0.0
        derived["min_kv_free_bound"] = float(derived["kv_free_base"].min())
        derived["dense_slots"] = bool(np.array_equal(self.slots, np.arange(len(self.slots))))
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class ZoneView:
    """The whole zone at one moment; share freely, never mutate."""

    zone_id: str
    region_id: str
    built_at: float
    gpus: tuple[GpuState, ...] = ()
    by_model: Mapping[str, ModelIndex] = field(default_factory=lambda: MappingProxyType({}))
    #: The agent's in-flight charges (read, never written, by decisions).
    accounting: Accounting = field(default_factory=Accounting)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.by_model)

    def gpu(self, gpu_id: str) -> GpuState | None:
        for state in self.gpus:
            if state.id == gpu_id:
                return state
        return None

    def available_count(self) -> int:
        return sum(1 for g in self.gpus if g.unavailable_reason() is None)


# ---------------------------------------------------------------------------- building


@dataclass(frozen=True, slots=True)
class ViewSettings:
    stale_after_s: float = 1.0
    #: Typical prompt tokens of a request, to turn a scraped queue length into tokens
    #: until the worker's own counters measure it (:mod:`zone_agent.prompt_sizes`).
    mean_prompt_tokens: float = 1024.0


def trusted(metrics: GpuMetrics | None, now: float, settings: ViewSettings) -> bool:
    """Whether a GPU's last scrape is believed: there is one, and it is no older than
    ``stale_after_s`` (the rule's one home: the view's rows, the models it shows loaded,
    the agent's count of views blind to a GPU)."""
    return metrics is not None and metrics.age(now) <= settings.stale_after_s


def _model_metrics(state: GpuState, model: str) -> ModelMetrics | None:
    if state.metrics is None:
        return None
    # Samples without a model label (an engine serving one model) count for it.
    return state.metrics.models.get(model) or state.metrics.models.get("")


def _loaded(state: GpuState, model: str, now: float, settings: ViewSettings) -> bool:
    """Whether the model is loaded, as far as a fresh scrape can tell (unknown: yes)."""
    metrics = state.metrics
    if metrics is None or not trusted(metrics, now, settings):
        return True
    named = {m for m in metrics.models if m}
    return not named or model in named


def _ring(ids: Sequence[str]) -> tuple[npt.NDArray[np.uint64], Ints]:
    """The consistent-hash ring of ``ids`` (the reference form): each GPU's
    ``RING_VNODES`` points (:func:`_point`), sorted, ties by position. The builder makes
    the same ring with :func:`_ring_of` from points it keeps per GPU; tests pin the two
    together."""
    points: list[tuple[int, int]] = []
    for position, gpu_id in enumerate(ids):
        for vnode in range(RING_VNODES):
            points.append((_point(gpu_id, vnode), position))
    points.sort()
    return (
        np.array([p for p, _ in points], dtype=np.uint64),
        np.array([o for _, o in points], dtype=np.int64),
    )


def _point(gpu_id: str, vnode: int) -> int:
    """One virtual node's point: the first 8 bytes of md5("id#vnode"), big-endian."""
    digest = hashlib.md5(f"{gpu_id}#{vnode}".encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big")


def _vnodes(gpu_id: str) -> npt.NDArray[np.uint64]:
    """One GPU's points on the ring, in vnode order."""
    return np.array([_point(gpu_id, vnode) for vnode in range(RING_VNODES)], dtype=np.uint64)


def _ring_of(
    vnodes: Sequence[npt.NDArray[np.uint64]],
) -> tuple[npt.NDArray[np.uint64], Ints]:
    """:func:`_ring` from each position's :func:`_vnodes`: a stable sort of the points
    keeps ties in position order, as sorting (point, position) pairs does. Hashing is
    then once per GPU, not per membership change: at a thousand GPUs the reference form
    held the loop for ~0.4 s whenever a GPU joined or left (``bench/scrape_round.py``)."""
    if not vnodes:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    points = np.concatenate(vnodes)
    owners = np.repeat(np.arange(len(vnodes), dtype=np.int64), RING_VNODES)
    order = np.argsort(points, kind="stable")
    return _frozen(points[order]), _frozen(owners[order])


#: Columns of a per-candidate row (see :func:`_row`).
_COLUMNS = 19


def _row(
    state: GpuState, model: str, profile: GpuProfile, now: float, settings: ViewSettings
) -> tuple[float, ...]:
    metrics = _model_metrics(state, model)
    fresh = metrics is not None and trusted(state.metrics, now, settings)
    block = float(profile.block_size)
    kv_total = float(profile.num_gpu_blocks)
    if metrics is not None:
        # The worker's own KV geometry wins over the table's (it may be configured).
        block = float(metrics.block_size or block)
        kv_total = float(metrics.kv_blocks_total or kv_total)
    weight = state.health.weight
    raw_rate = profile.prefill_tokens_per_s
    max_len = float(min(profile.max_model_len, kv_total * block))
    running = waiting = usage = 0.0
    kv_free = math.nan
    external = 0.0
    if fresh and metrics is not None:
        running, waiting = metrics.running, metrics.waiting
        if metrics.kv_usage is not None:  # None: the engine does not export it (unknown)
            usage = metrics.kv_usage
            kv_free = kv_total * (1.0 - usage)
        others = max(0.0, waiting - state.own_at_scrape.prefilling)
        if others:
            external = others * tokens_per_request(
                state.prompt_tokens, model, settings.mean_prompt_tokens
            )
    used_tokens = usage * kv_total * block
    memory_s = profile.weight_read_s + used_tokens * profile.kv_read_s_per_token
    chunk_s = profile.max_num_batched_tokens / raw_rate if raw_rate > 0 else 0.0
    # Each pass also computes one token per running sequence (they share the pass's
    # token budget), and its KV reads stretch it when they outlast the chunk's compute.
    decode_s = running / raw_rate if raw_rate > 0 else 0.0
    step_extra = (profile.step_overhead_s + decode_s + max(0.0, memory_s - chunk_s)) / weight
    capacity = int(kv_total * block * BYTES_PER_TOKEN / BLOCK_BYTES)
    return (
        raw_rate * weight,
        raw_rate,
        weight,
        max_len,
        block,
        kv_total,
        kv_free,
        state.own_at_scrape.kv_blocks,
        float(profile.max_num_seqs),
        float(profile.max_num_batched_tokens),
        external,
        running,
        waiting,
        usage,
        1.0 if fresh else 0.0,
        step_extra,
        float(capacity),
        state.own_at_scrape.prefilling,
        state.health.ramp,
    )


#: (model, GPU) entries a sliced build computes per step: about a millisecond of the
#: loop's time (``bench/scrape_round.py``).
BUILD_STEP = 64
#: What hashing a new GPU's points on the ring costs, in entries (~0.15 ms).
VNODES_COST = 12


def _as_floats(column: Floats) -> npt.NDArray[Any]:
    return column


#: The index's columns made of :func:`_row`'s values: (field, place in the row, what
#: the column of those values becomes). ``ViewBuilder._index`` makes every column from
#: it, ``ViewBuilder.with_gpu`` one GPU's entry of each: one list, so they agree.
_ROW_COLUMNS: tuple[tuple[str, int, Callable[[Floats], npt.NDArray[Any]]], ...] = (
    ("rate", 0, _as_floats),
    ("raw_rate", 1, _as_floats),
    ("weight", 2, _as_floats),
    ("ramp", 18, _as_floats),
    ("max_model_len", 3, _as_floats),
    ("block_size", 4, _as_floats),
    ("kv_total", 5, _as_floats),
    ("kv_free_scraped", 6, _as_floats),
    ("own_kv_at_scrape", 7, _as_floats),
    ("own_prefilling_at_scrape", 17, _as_floats),
    ("max_seqs", 8, _as_floats),
    ("max_batched", 9, _as_floats),
    ("external_queued", 10, _as_floats),
    ("running", 11, _as_floats),
    ("waiting", 12, _as_floats),
    ("kv_usage", 13, _as_floats),
    ("fresh", 14, lambda column: column > 0),
    ("step_extra_s", 15, _as_floats),
    ("prefix_capacity", 16, lambda column: column.astype(np.int64)),
)


def _row_columns(rows: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[Any]]:
    """The :data:`_ROW_COLUMNS` of ``rows`` (one :func:`_row` per line), read-only."""
    return {
        name: _frozen(convert(np.ascontiguousarray(rows[:, place])))
        for name, place, convert in _ROW_COLUMNS
    }


def _wrr(raw_rate: Floats) -> Ints:
    """Integer weights for weighted round robin: each prefill rate over the slowest."""
    slowest = float(raw_rate.min()) if len(raw_rate) else 1.0
    return _frozen(np.maximum(1, np.rint(raw_rate / max(slowest, 1e-9))).astype(np.int64))


def _flags(values: Sequence[bool]) -> Bools:
    return _frozen(np.array(values, dtype=np.bool_))


def _models_of(state: GpuState) -> tuple[str, ...]:
    """The models a GPU serves: its inventory's, else those its last scrape showed."""
    models = state.worker.models
    if not models and state.metrics is not None:
        models = tuple(m for m in state.metrics.models if m)
    return models


class _Gathered:
    """One model's index, gathered a GPU at a time (the slices of a build) in the order
    of its columns, so that making the index at the end is a few conversions."""

    __slots__ = (
        "canary",
        "half_open",
        "ids",
        "loaded",
        "positions",
        "profiles",
        "reasons",
        "rows",
        "slots",
        "sources",
        "versions",
    )

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.ids: list[str] = []
        self.slots: list[int] = []
        self.rows: list[tuple[float, ...]] = []
        self.profiles: list[GpuProfile] = []
        self.sources: list[ProfileSource] = []
        self.reasons: list[str | None] = []
        self.loaded: list[bool] = []
        self.half_open: list[bool] = []
        self.canary: list[bool] = []
        self.versions: list[str | None] = []


class ViewBuilder:
    """Builds views; caches what only changes with membership (hash rings, WRR weights).

    :meth:`build` makes a view at once. :meth:`steps` makes the same view a slice at a
    time: a generator that yields after every ``BUILD_STEP`` (model, GPU) entries and
    returns the view, so that a caller on an event loop can let other work run between
    slices (a thousand GPUs take ~12 ms, which would otherwise hold the loop in one go).
    ``build`` runs the same steps without pausing: one code path."""

    def __init__(
        self,
        zone_id: str,
        region_id: str,
        settings: ViewSettings | None = None,
        pricing: Pricing | None = None,
    ) -> None:
        self.zone_id = zone_id
        self.region_id = region_id
        self.settings = settings or ViewSettings()
        self.pricing = pricing or static_pricing()
        self._rings: dict[tuple[str, ...], tuple[npt.NDArray[np.uint64], Ints]] = {}
        #: Each GPU's points on the ring: hashed once, when it first appears.
        self._vnodes: dict[str, npt.NDArray[np.uint64]] = {}

    def build(self, gpus: Sequence[GpuState], accounting: Accounting, now: float) -> ZoneView:
        steps = self.steps(gpus, accounting, now)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                view: ZoneView = done.value
                return view

    def steps(
        self, gpus: Sequence[GpuState], accounting: Accounting, now: float, step: int = BUILD_STEP
    ) -> Generator[None, None, ZoneView]:
        """The view of ``gpus`` at ``now``, built ``step`` (model, GPU) entries at a time."""
        ordered = tuple(sorted(gpus, key=lambda g: g.id))
        served: dict[str, list[int]] = {}
        for position, state in enumerate(ordered):
            for model in _models_of(state):
                served.setdefault(model, []).append(position)
        by_model: dict[str, ModelIndex] = {}
        budget = step
        for model, positions in sorted(served.items()):
            gathered = _Gathered()
            for position in positions:
                self._gather(gathered, position, ordered[position], model, now)
                budget -= 1
                if budget <= 0:
                    yield
                    budget = step
            ids = tuple(gathered.ids)
            ring = self._rings.get(ids)
            if ring is None:
                for gpu_id in ids:
                    if gpu_id not in self._vnodes:
                        self._vnodes[gpu_id] = _vnodes(gpu_id)
                        budget -= VNODES_COST
                        if budget <= 0:
                            yield
                            budget = step
                ring = self._rings[ids] = _ring_of([self._vnodes[i] for i in ids])
            by_model[model] = self._index(model, gathered, ring)
        live = {ids for ids in (index.ids for index in by_model.values())}
        self._rings = {ids: ring for ids, ring in self._rings.items() if ids in live}
        if len(self._vnodes) > len(ordered):
            self._vnodes = {s.id: self._vnodes[s.id] for s in ordered if s.id in self._vnodes}
        return ZoneView(
            self.zone_id, self.region_id, now, ordered, MappingProxyType(by_model), accounting
        )

    def _gather(
        self, into: _Gathered, position: int, state: GpuState, model: str, now: float
    ) -> None:
        priced = self.pricing(state.id, state.worker.gpu_type, model, now)
        labels = dict(state.worker.labels)
        into.positions.append(position)
        into.ids.append(state.id)
        into.slots.append(state.slot)
        into.rows.append(_row(state, model, priced.profile, now, self.settings))
        into.profiles.append(priced.profile)
        into.sources.append(priced.source)
        into.reasons.append(state.unavailable_reason())
        into.loaded.append(_loaded(state, model, now, self.settings))
        into.half_open.append(state.health.half_open)
        into.canary.append(labels.get(CANARY_LABEL, "").lower() in ("1", "true", "yes"))
        into.versions.append(labels.get(VERSION_LABEL))

    def _index(
        self, model: str, parts: _Gathered, ring: tuple[npt.NDArray[np.uint64], Ints]
    ) -> ModelIndex:
        rows = np.array(parts.rows, dtype=np.float64).reshape(len(parts.ids), _COLUMNS)
        columns = _row_columns(rows)
        reasons = tuple(parts.reasons)
        slots = np.array(parts.slots, dtype=np.int64)
        return ModelIndex(
            model=model,
            ids=tuple(parts.ids),
            positions=_frozen(np.array(parts.positions, dtype=np.int64)),
            slots=_frozen(slots),
            profiles=tuple(parts.profiles),
            sources=tuple(parts.sources),
            reasons=reasons,
            available=_flags([r is None for r in reasons]),
            half_open=_flags(parts.half_open),
            loaded=_flags(parts.loaded),
            canary=_flags(parts.canary),
            versions=tuple(parts.versions),
            wrr_weight=_wrr(columns["raw_rate"]),
            ring_points=ring[0],
            ring_owner=ring[1],
            position_of_slot=MappingProxyType({slot: i for i, slot in enumerate(parts.slots)}),
            **columns,
        )

    def with_gpu(self, view: ZoneView, state: GpuState) -> ZoneView:
        """``view`` with one GPU's state replaced (its health after an ejection): that
        GPU's entry gathered again in each of its models' indexes, at the view's own
        time, the rest of the view shared. The same view a build of the same states at
        ``view.built_at`` makes (tests pin the two), in time that does not grow with
        the zone's GPUs but by a copy of each column: an ejection at a thousand GPUs
        held the loop ~12 ms for a whole build. Raises ``KeyError`` when the GPU is not
        in ``view``, ``ValueError`` when ``state`` serves other models than it did."""
        at = next((i for i, s in enumerate(view.gpus) if s.id == state.id), None)
        if at is None:
            raise KeyError(state.id)
        if _models_of(state) != _models_of(view.gpus[at]):
            raise ValueError(f"GPU {state.id} serves other models now: build the view anew")
        by_model = dict(view.by_model)
        for model, index in view.by_model.items():
            try:
                i = index.ids.index(state.id)
            except ValueError:
                continue
            one = _Gathered()
            self._gather(one, at, state, model, view.built_at)
            by_model[model] = _with_entry(index, i, one)
        gpus = (*view.gpus[:at], state, *view.gpus[at + 1 :])
        return ZoneView(
            view.zone_id,
            view.region_id,
            view.built_at,
            gpus,
            MappingProxyType(by_model),
            view.accounting,
        )


def _with_entry(index: ModelIndex, i: int, one: _Gathered) -> ModelIndex:
    """``index`` with its entry ``i`` replaced by the one GPU gathered in ``one``."""
    changes: dict[str, Any] = {}
    for name, value in _row_columns(np.array(one.rows, dtype=np.float64)).items():
        column = getattr(index, name).copy()
        column[i] = value[0]
        changes[name] = _frozen(column)

    def entry(values: tuple[_T, ...], value: _T) -> tuple[_T, ...]:
        return (*values[:i], value, *values[i + 1 :])

    def flag(values: Bools, value: bool) -> Bools:
        column = values.copy()
        column[i] = value
        return _frozen(column)

    reason = one.reasons[0]
    slots = index.slots
    if int(slots[i]) != one.slots[0]:
        slots = index.slots.copy()
        slots[i] = one.slots[0]
        _frozen(slots)
        changes["position_of_slot"] = MappingProxyType(
            {int(slot): j for j, slot in enumerate(slots)}
        )
    return replace(
        index,
        slots=slots,
        profiles=entry(index.profiles, one.profiles[0]),
        sources=entry(index.sources, one.sources[0]),
        reasons=entry(index.reasons, reason),
        available=flag(index.available, reason is None),
        half_open=flag(index.half_open, one.half_open[0]),
        loaded=flag(index.loaded, one.loaded[0]),
        canary=flag(index.canary, one.canary[0]),
        versions=entry(index.versions, one.versions[0]),
        wrr_weight=_wrr(changes["raw_rate"]),
        **changes,
    )


def ring_lookup(index: ModelIndex, key: int) -> int:
    """Position on the ring of the first virtual node at or after ``key`` (64-bit)."""
    points = index.ring_points
    at = int(np.searchsorted(points, np.uint64(key & 0xFFFFFFFFFFFFFFFF), side="left"))
    return at % len(points) if len(points) else 0


__all__ = [
    "GpuState",
    "ModelIndex",
    "Pricing",
    "ViewBuilder",
    "ViewSettings",
    "ZoneView",
    "profile_for",
    "ring_lookup",
    "static_priced",
    "static_pricing",
    "trusted",
]

"""Typed, frozen records shared by every tier.

Records that are written to the state store derive from :class:`StoredRecord` and carry
a ``schema`` version (serialised as ``"schema"``), so a reader can tell which shape it
holds and refuse one it does not know instead of misreading it. Bump
``SCHEMA_VERSION`` of a record when its shape changes incompatibly.

Per-request records (:class:`RouteRequest`) and decisions (:class:`Decision`) are frozen
too: a routing decision is a pure function of a request and an immutable snapshot. The
decision records are frozen dataclasses rather than pydantic models, for speed (see the
"decisions" section).
"""

from __future__ import annotations

import functools
import ipaddress
import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from itertools import repeat
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

# Ids (regions, zones, GPUs, tenants), country codes and model names have one definition,
# in the bottom layer: an id valid in a policy file is valid in a record, and the reverse.
from policies.types import CountryCode as CountryCode
from policies.types import Identifier as Identifier
from policies.types import ModelName as ModelName
from policies.types import NonNegInt as NonNegInt

NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
UnitFloat = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class Frozen(BaseModel):
    """Base for every record: immutable, no unknown fields, no silent coercion of strings."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


_M = TypeVar("_M", bound=BaseModel)
_set_attribute = object.__setattr__


def construct_every_field(cls: type[_M], values: dict[str, Any]) -> _M:
    """``cls.model_construct(**values)`` (no validation: trusted data) when ``values``
    names every field of ``cls`` and nothing else (in the fields' order, as
    ``model_construct`` orders them), without its per-field work.

    That is all ``model_construct`` does then (pydantic 2: the values become the
    instance's ``__dict__``, every field is set, no extra, no private attributes), less
    its search of each field's aliases and default: the fleet simulator builds a
    request record for each of its ~10⁶ simulated requests. A model with aliases,
    extras, private attributes or a post-init hook goes through ``model_construct``.
    ``values`` becomes the instance's; do not reuse it."""
    names = _plain_fields(cls)
    if names is None or values.keys() != names:
        return cls.model_construct(**values)
    model = cls.__new__(cls)
    _set_attribute(model, "__dict__", values)
    _set_attribute(model, "__pydantic_fields_set__", set(names))
    _set_attribute(model, "__pydantic_extra__", None)
    _set_attribute(model, "__pydantic_private__", None)
    return model


@functools.cache
def _plain_fields(cls: type[BaseModel]) -> frozenset[str] | None:
    """The field names of ``cls`` if constructing it is just setting them, else None."""
    fields_ = cls.model_fields
    plain = (
        not cls.__pydantic_root_model__
        and cls.__pydantic_post_init__ is None
        and not cls.__private_attributes__
        and cls.model_config.get("extra") != "allow"
        and all(f.alias is None and f.validation_alias is None for f in fields_.values())
    )
    return frozenset(fields_) if plain else None


class StoredRecord(Frozen):
    """A record that is written to the state store. ``schema`` is its shape version."""

    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: int = Field(default=1, alias="schema", ge=1)

    @model_validator(mode="after")
    def _known_schema(self) -> StoredRecord:
        if self.schema_version > self.SCHEMA_VERSION:
            raise ValueError(
                f"{type(self).__name__} schema {self.schema_version} is newer than this "
                f"gtm understands ({self.SCHEMA_VERSION}); upgrade gtm"
            )
        return self

    def to_json(self) -> bytes:
        """Serialise for storage (``schema`` under its wire name)."""
        return self.model_dump_json(by_alias=True).encode()


# ---------------------------------------------------------------------------- enums


class WorkerState(StrEnum):
    """Lifecycle of a GPU worker as the zone agent sees it."""

    STARTING = "starting"  # registered, model loading / warming up
    READY = "ready"
    DRAINING = "draining"  # finishes in-flight work, takes no new requests
    UNHEALTHY = "unhealthy"  # ejected by health checks / outlier detection
    DOWN = "down"


class Priority(StrEnum):
    """Priority classes, served in this order when a region is saturated."""

    INTERACTIVE = "interactive"
    BATCH = "batch"
    BEST_EFFORT = "best-effort"

    @property
    def rank(self) -> int:
        """0 is served first."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.INTERACTIVE: 0, Priority.BATCH: 1, Priority.BEST_EFFORT: 2}


class Tier(StrEnum):
    GLOBAL = "global"
    REGIONAL = "regional"
    ZONE = "zone"


class DrainTarget(StrEnum):
    REGION = "region"
    ZONE = "zone"
    GPU = "gpu"


# ---------------------------------------------------------------------------- geography


class GeoPoint(Frozen):
    """A point on Earth, WGS 84 degrees."""

    lat: float = Field(ge=-90.0, le=90.0, allow_inf_nan=False)
    lon: float = Field(ge=-180.0, le=180.0, allow_inf_nan=False)

    def distance_km(self, other: GeoPoint) -> float:
        """Great-circle distance (haversine, mean Earth radius 6371.0088 km, IUGG)."""
        lat1, lon1, lat2, lon2 = map(math.radians, (self.lat, self.lon, other.lat, other.lon))
        a = (
            math.sin((lat2 - lat1) / 2) ** 2
            + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
        )
        return 2 * 6371.0088 * math.asin(min(1.0, math.sqrt(a)))


# ---------------------------------------------------------------------------- topology


class Endpoint(Frozen):
    """Where a service listens. ``address`` is what DNS answers carry (A/AAAA)."""

    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://")
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None


class Region(StoredRecord):
    id: Identifier
    name: str = ""
    location: GeoPoint
    jurisdiction: str = Field(min_length=1, max_length=63)
    country: CountryCode
    endpoints: tuple[Endpoint, ...] = ()


class Zone(StoredRecord):
    id: Identifier
    region_id: Identifier
    endpoints: tuple[Endpoint, ...] = ()


class GpuWorker(StoredRecord):
    id: Identifier
    zone_id: Identifier
    region_id: Identifier
    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://")
    gpu_type: str = Field(min_length=1, max_length=63)
    models: tuple[ModelName, ...]
    state: WorkerState = WorkerState.READY
    labels: tuple[tuple[str, str], ...] = ()


class Tenant(StoredRecord):
    id: Identifier
    name: str = ""
    priority: Priority = Priority.INTERACTIVE


class Drain(StoredRecord):
    """An operator's drain of a region, zone or GPU; present in the store while in force."""

    target: DrainTarget
    id: Identifier
    reason: str = Field(default="", max_length=1024)
    by: str = Field(default="", max_length=256)
    at: NonNegFloat = 0.0


# ---------------------------------------------------------------------------- summaries


class GpuClassLoad(Frozen):
    """One GPU class (a GPU type at one tensor-parallel degree) of a :class:`ModelLoad`:
    what a router needs to price a place by the GPUs that would take a request there
    rather than by their average (:func:`gtm.routing.cost.prefill_options`)."""

    #: The class: the GPU type, ``<n>x<type>`` for a tensor-parallel group of n.
    gpu_class: str = Field(min_length=1, max_length=63)
    healthy_gpus: NonNegInt
    #: Sum of the healthy GPUs' prefill rates, tokens/s.
    prefill_tokens_per_s: NonNegFloat
    #: Healthy GPUs with nothing waiting to prefill and room for one more sequence: a
    #: request sent there starts its prefill at once.
    free_gpus: NonNegInt = 0
    queued_prefill_tokens: NonNegInt = 0
    kv_blocks_free: NonNegInt = 0

    @model_validator(mode="after")
    def _consistent(self) -> GpuClassLoad:
        if self.free_gpus > self.healthy_gpus:
            raise ValueError("free_gpus cannot exceed healthy_gpus")
        return self

    @property
    def ms_per_token(self) -> float:
        """Prefill time per prompt token on one GPU of the class, ms (inf: no rate)."""
        if self.prefill_tokens_per_s <= 0.0 or self.healthy_gpus == 0:
            return math.inf
        return 1000.0 * self.healthy_gpus / self.prefill_tokens_per_s


class ModelLoad(Frozen):
    """Capacity and load of one model at one place (a zone or a region).

    Rates are aggregates over the GPUs that serve the model there; the predicted
    time-to-first-token (ARCHITECTURE §2) is derived from them, not stored.
    ``classes`` breaks the healthy GPUs down by GPU class, fastest first (optional:
    a summary without it is priced by the aggregate alone, as before it existed).
    """

    model: ModelName
    gpus: NonNegInt
    healthy_gpus: NonNegInt
    prefill_tokens_per_s: NonNegFloat
    decode_tokens_per_s: NonNegFloat = 0.0
    queued_prefill_tokens: NonNegInt = 0
    running_requests: NonNegInt = 0
    waiting_requests: NonNegInt = 0
    max_running_requests: NonNegInt = 0
    kv_blocks_total: NonNegInt = 0
    kv_blocks_free: NonNegInt = 0
    classes: tuple[GpuClassLoad, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> ModelLoad:
        if self.healthy_gpus > self.gpus:
            raise ValueError("healthy_gpus cannot exceed gpus")
        if self.kv_blocks_free > self.kv_blocks_total:
            raise ValueError("kv_blocks_free cannot exceed kv_blocks_total")
        if self.classes:
            if sum(c.healthy_gpus for c in self.classes) > self.healthy_gpus:
                raise ValueError("the classes' healthy_gpus cannot exceed healthy_gpus")
            speeds = [c.ms_per_token for c in self.classes]
            if speeds != sorted(speeds):
                raise ValueError("classes must be listed fastest first")
        return self

    @property
    def utilisation(self) -> float:
        """Fraction of running-sequence capacity in use, in [0, 1] (1 if no capacity)."""
        if self.max_running_requests == 0:
            return 1.0
        return min(1.0, self.running_requests / self.max_running_requests)

    def queue_delay_ms(self) -> float:
        """Time to drain the queued uncached prefill tokens, ms (inf when nothing serves)."""
        if self.prefill_tokens_per_s <= 0:
            return math.inf
        return 1000.0 * self.queued_prefill_tokens / self.prefill_tokens_per_s


def merge_classes(groups: Iterable[Sequence[GpuClassLoad]]) -> tuple[GpuClassLoad, ...]:
    """The GPU classes of several places (zones of a region, models of a region) as one
    place's: counts and rates summed per class, fastest first (ties by name)."""
    sums: dict[str, list[float]] = {}
    for group in groups:
        for c in group:
            row = sums.setdefault(c.gpu_class, [0, 0.0, 0, 0, 0])
            row[0] += c.healthy_gpus
            row[1] += c.prefill_tokens_per_s
            row[2] += c.free_gpus
            row[3] += c.queued_prefill_tokens
            row[4] += c.kv_blocks_free
    merged = [
        GpuClassLoad(
            gpu_class=name,
            healthy_gpus=int(row[0]),
            prefill_tokens_per_s=row[1],
            free_gpus=int(row[2]),
            queued_prefill_tokens=int(row[3]),
            kv_blocks_free=int(row[4]),
        )
        for name, row in sums.items()
    ]
    return tuple(sorted(merged, key=lambda c: (c.ms_per_token, c.gpu_class)))


def taking_free(classes: tuple[GpuClassLoad, ...], requests: int) -> tuple[GpuClassLoad, ...]:
    """``classes`` after ``requests`` more took free GPUs, fastest first (what was sent
    to a place since its summary: each tier's GPU choice starts them there)."""
    if requests <= 0 or not any(c.free_gpus for c in classes):
        return classes
    out: list[GpuClassLoad] = []
    for c in classes:
        took = min(requests, c.free_gpus)
        requests -= took
        out.append(c if took == 0 else c.model_copy(update={"free_gpus": c.free_gpus - took}))
    return tuple(out)


class ZoneSummary(StoredRecord):
    """Published by a zone agent under a lease; read by its regional LB."""

    zone_id: Identifier
    region_id: Identifier
    published_at: NonNegFloat
    healthy: bool = True
    models: tuple[ModelLoad, ...] = ()
    #: A sketch of prefix-block hashes resident in the zone's caches (for locality).
    prefix_sketch: tuple[int, ...] = ()

    def load_for(self, model: str) -> ModelLoad | None:
        return next((m for m in self.models if m.model == model), None)


class ModelTtft(Frozen):
    """A region's predicted TTFT for one model, excluding the client's RTT: the best
    zone's intra-region RTT + queueing delay (a request's own prefill comes on top)."""

    model: ModelName
    ttft_ms: NonNegFloat


class RegionSummary(StoredRecord):
    """Published by a regional LB under a lease; read by the global tier and by peer
    regional LBs (spillover)."""

    region_id: Identifier
    published_at: NonNegFloat
    healthy: bool = True
    zones_total: NonNegInt = 0
    zones_healthy: NonNegInt = 0
    models: tuple[ModelLoad, ...] = ()
    #: Fraction of the region's serving capacity in use (0 idle, 1 every zone full).
    saturation: UnitFloat = 0.0
    #: Models for which every zone of the region is saturated.
    saturated_models: tuple[ModelName, ...] = ()
    predicted_ttft: tuple[ModelTtft, ...] = ()
    #: Requests a second spilled into / out of the region (the publisher's view).
    spill_in_per_s: NonNegFloat = 0.0
    spill_out_per_s: NonNegFloat = 0.0
    #: Where the region's regional LB listens (for peers and the global tier).
    endpoints: tuple[Endpoint, ...] = ()

    def load_for(self, model: str) -> ModelLoad | None:
        return next((m for m in self.models if m.model == model), None)

    def ttft_for(self, model: str) -> float | None:
        return next((t.ttft_ms for t in self.predicted_ttft if t.model == model), None)


# ---------------------------------------------------------------------------- requests


class ClientInfo(Frozen):
    """What is known about where a request comes from (GeoIP, ECS, or the caller)."""

    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    country: CountryCode | None = None
    location: GeoPoint | None = None


class RouteRequest(Frozen):
    """One inference request, as every tier's routing sees it. Holds no prompt text."""

    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=128)
    model: ModelName
    input_tokens: NonNegInt
    max_output_tokens: NonNegInt = 0
    tenant: Identifier
    client: ClientInfo = ClientInfo()
    data_class: str = Field(default="default", min_length=1, max_length=63)
    priority: Priority = Priority.INTERACTIVE
    #: Prefix-chained block hashes of the prompt (block i depends on blocks 0..i).
    prefix_hashes: tuple[int, ...] = ()

    @field_validator("prefix_hashes")
    @classmethod
    def _bounded_prefix(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        # 1M-token context / 16-token blocks = 65,536 blocks: anything longer is an attack.
        if len(value) > 65_536:
            raise ValueError("at most 65536 prefix block hashes")
        return value


# ---------------------------------------------------------------------------- decisions
#
# The per-decision records are frozen, slotted dataclasses, not pydantic models: the
# routing framework builds one trace per request at every tier, from data it has already
# checked, and they are never written to the state store. Validating them on
# construction was most of a decision's cost (bench/routing_framework.py). APIs and logs
# serialise them with ``decision_adapter`` / ``decision_trace_adapter`` below, which also
# validate (with the constraints annotated here) when reading one back.

#: How the adapters read a record back: unknown fields are refused, as for every Frozen.
#: The adapters build their schema on first use (``defer_build``), not at import: a cost
#: that a process which never serialises a decision (the CLI) does not pay.
_READ_BACK = ConfigDict(extra="forbid", defer_build=True)


@dataclass(frozen=True, slots=True)
class FilterStep:
    """One filter's effect on the candidate set."""

    __pydantic_config__: ClassVar[ConfigDict] = _READ_BACK

    plugin: str
    removed: tuple[str, ...] = ()
    reasons: tuple[tuple[str, str], ...] = ()  # (candidate id, why)
    remaining: NonNegInt = 0


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """A surviving candidate's per-scorer scores (each in [0, 1]) and weighted total."""

    __pydantic_config__: ClassVar[ConfigDict] = _READ_BACK

    candidate: str
    scores: tuple[tuple[str, float], ...] = ()
    total: float = 0.0

    def score(self, plugin: str) -> float | None:
        return next((s for name, s in self.scores if name == plugin), None)

    @classmethod
    def batch(
        cls,
        candidates: Sequence[str],
        scores: Sequence[tuple[tuple[str, float], ...]],
        totals: Sequence[float],
    ) -> tuple[CandidateScore, ...]:
        """``tuple(map(CandidateScore, candidates, scores, totals))``, built in C loops.

        A frozen dataclass's ``__init__`` sets each field through a Python-level
        ``object.__setattr__`` call, and a full trace holds one record per surviving
        candidate. This sets the slots column by column through their descriptors, in C
        loops; the result is the same (``tests/unit/gtm/test_models.py`` compares them).
        """
        n = len(candidates)
        if len(scores) != n or len(totals) != n:
            raise ValueError(
                f"CandidateScore.batch: {n} candidates, {len(scores)} score rows, "
                f"{len(totals)} totals"
            )
        records: tuple[CandidateScore, ...] = tuple(map(object.__new__, repeat(cls, n)))
        for set_field, column in zip(
            _CANDIDATE_SCORE_SLOTS, (candidates, scores, totals), strict=True
        ):
            # any() drains the map in C: a slot setter returns None, which is falsy.
            any(map(set_field, records, column))
        return records


#: The slot setters of CandidateScore's fields, in field order (for ``batch``).
_CANDIDATE_SCORE_SLOTS: tuple[Callable[[object, object], None], ...] = tuple(
    vars(CandidateScore)[f.name].__set__ for f in fields(CandidateScore)
)


class ScoreIssueKind(StrEnum):
    """How a scorer's value broke the [0, 1] contract (the runner repaired it)."""

    NAN = "nan"  # NaN → 0
    MISSING = "missing"  # no value for a candidate → 0
    BELOW = "below"  # < 0 (incl. -inf) → 0
    ABOVE = "above"  # > 1 (incl. +inf) → 1


@dataclass(frozen=True, slots=True)
class ScoreIssue:
    """One score the runner had to repair; a non-empty list points at a buggy scorer."""

    __pydantic_config__: ClassVar[ConfigDict] = _READ_BACK

    plugin: str
    candidate: str
    kind: ScoreIssueKind


@dataclass(frozen=True, slots=True)
class DecisionTrace:
    """Why a decision came out as it did: who removed what, how the rest scored."""

    __pydantic_config__: ClassVar[ConfigDict] = _READ_BACK

    profile: str
    candidates: tuple[str, ...]
    filters: tuple[FilterStep, ...] = ()
    scores: tuple[CandidateScore, ...] = ()
    picker: str = ""
    #: (scorer, weight) as configured; a candidate's total is Σ w·s / Σ w.
    weights: tuple[tuple[str, float], ...] = ()
    score_issues: tuple[ScoreIssue, ...] = ()
    #: Survivors whose scores were left out because the profile traces only its top N.
    scores_omitted: NonNegInt = 0

    def removed_by(self) -> Mapping[str, str]:
        """Candidate id → the filter that removed it."""
        return {cid: step.plugin for step in self.filters for cid in step.removed}


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one routing decision at one tier."""

    __pydantic_config__: ClassVar[ConfigDict] = _READ_BACK

    request_id: str
    tier: Tier
    choice: str
    trace: DecisionTrace
    #: Predicted cost of the choice in ms of time-to-first-token, when the profile knows it.
    predicted_ttft_ms: NonNegFloat | None = None
    kind: Literal["decision"] = "decision"


#: Serialises and reads back decisions: ``decision_adapter.dump_json(decision)`` for an API
#: or a log line, ``decision_adapter.validate_json(raw)`` to read one (validated).
decision_adapter: TypeAdapter[Decision] = TypeAdapter(Decision)
#: The same for a bare trace (e.g. ``NoEligibleCandidate.trace`` in a refusal's log line).
decision_trace_adapter: TypeAdapter[DecisionTrace] = TypeAdapter(DecisionTrace)

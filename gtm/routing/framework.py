"""Contracts of the routing pipeline: filter → score → pick, over columns (ARCHITECTURE §3).

Every tier routes with the same three extension points, after the Kubernetes Gateway API
Inference Extension scheduler ("0845 scheduler architecture proposal") and llm-d, and
runs them with the one runner of :mod:`gtm.routing.runner`. What a tier supplies is its
data layout: a :class:`Batch` holds one decision's candidates *by position* (their ids,
the request, the tier's own columns, the survivors so far), and plugins read it:

* a :class:`Filter` returns a :class:`Removal` — a mask over the positions and a reason
  per removed position, worked out only when a trace asks — or None (removes nothing);
* a :class:`Scorer` returns one float per position in [0, 1] (values at removed
  positions are ignored; the runner clamps, and repairs NaN to 0); weights live in the
  profile, not in the scorer;
* exactly one :class:`Picker` returns the chosen position among the survivors;
* a :class:`CostModel` returns each position's predicted TTFT in ms.

A plugin declares what it offers the runner as typed :class:`Capability` values (a
tier adds its own ``StrEnum`` for its fast paths) in the class attribute
``capabilities``; the runner never inspects names or roles. Per-view work is the
plugin's :meth:`Plugin.prepare` hook (Envoy's ``refresh()``): the runner calls it once
per view and hands the result back in :attr:`Batch.prepared`.

Decisions are sans-io: plugins are synchronous, never await, never do I/O, and never
mutate the request or the view. Determinism: the fleet simulator and the live tiers run
the same code, so the same request over the same view gives the same choice. A plugin
that randomises derives a :class:`random.Random` per request from ``(seed, request_id)``
with :func:`request_rng` and draws only through ``Random.random()``, the one method
whose sequence Python guarantees across versions (Python docs, ``random`` — "Notes on
Reproducibility"). Candidate order is part of the input: a tier lists its candidates
in a stable order (by id where it can, saying so with :attr:`Batch.ids_ascending`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.intp]


class ExtensionPoint(StrEnum):
    """Where a plugin runs in a decision; the ``extension_point`` metric label."""

    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    COST_MODEL = "cost_model"


class Capability(StrEnum):
    """What the core runner itself reads from a plugin's ``capabilities``.

    A tier's fast paths (:class:`gtm.routing.runner.FastPath`) name capabilities of the
    tier's own ``StrEnum``; these are the ones every tier shares.
    """

    #: Has per-view work: the runner calls ``prepare(view)`` once per view.
    PREPARE = "prepare"
    #: Its scores are in [0, 1] by construction: the runner skips the range check.
    SCORES_IN_RANGE = "scores-in-range"
    #: A picker that always takes the survivor of highest total (ties to the smallest
    #: id): a fast path may pick in its place.
    PICKS_MAX_TOTAL = "picks-max-total"
    #: Reads the profile's cost model: the runner calls ``bind_cost_model(model)`` when
    #: the profile is built, and refuses a profile without one.
    READS_COST_MODEL = "reads-cost-model"


class Plugin:
    """Optional base of plugins: a name, no capabilities, no per-view work."""

    #: The typed capabilities of every instance of the class (see :class:`Capability`).
    capabilities: ClassVar[frozenset[StrEnum]] = frozenset()

    def __init__(self, name: str) -> None:
        self.name = name

    def prepare(self, view: Any, /) -> object:
        """Work that depends on the view alone (called once per view when the class
        declares :attr:`Capability.PREPARE`); the result is ``batch.prepared[self]``."""
        return None


def capabilities_of(plugin: object) -> frozenset[StrEnum]:
    """The capabilities ``plugin``'s class declares (none for a plain object)."""
    declared: frozenset[StrEnum] = getattr(type(plugin), "capabilities", frozenset())
    return declared


class HasRequestId(Protocol):
    @property
    def request_id(self) -> str: ...


#: Builds the per-request random source of a randomised plugin from (request, seed).
RngFactory = Callable[[HasRequestId, int], random.Random]


def request_rng(request: HasRequestId, seed: int = 0) -> random.Random:
    """A :class:`random.Random` that depends only on ``seed`` and the request id.

    String seeds are hashed with SHA-512 by ``random.seed`` (version 2), independent of
    ``PYTHONHASHSEED``, so every process derives the same sequence for the same request.
    """
    return random.Random(f"{seed}:{request.request_id}")


def uniform_index(rng: random.Random, n: int) -> int:
    """An index in ``range(n)`` from one ``rng.random()`` draw (see module docstring)."""
    # min() is a guard: the float product must never reach n, even for a huge n or an
    # injected random source that returns 1.0.
    return min(int(rng.random() * n), n - 1)


# ---------------------------------------------------------------------------- the batch


class Batch:
    """One decision's working set: the candidates by position (ids unique within a
    batch: the tier's layout guarantees it), the request, the view, and which positions
    are still alive. A tier subclasses it with its own columns.

    ``alive`` is owned by the runner while the filters run; after them (``seal``) it no
    longer changes and :attr:`survivors` is cached.
    """

    __slots__ = ("_survivors", "alive", "all_alive", "ids", "prepared", "request", "view")

    #: Whether positions are in ascending id order, so that the first of tied positions
    #: is the smallest id (the max-score picker then needs no tie check).
    ids_ascending: ClassVar[bool] = False

    def __init__(
        self, ids: Sequence[str], request: HasRequestId, view: object, alive: Bools | None = None
    ) -> None:
        """``alive``: the all-true mask to start from (else made); it may be shared and
        read only, as the runner replaces a batch's mask and never writes it."""
        self.ids = ids
        self.request = request
        #: What ``prepare`` is called with, once per distinct object.
        self.view = view
        if alive is None:
            alive = np.empty(len(ids), dtype=np.bool_)
            alive.fill(True)  # (np.ones costs three times as much on a few candidates)
        self.alive: Bools = alive
        #: True while no filter removed anything (plugins may skip masking then).
        self.all_alive = True
        self._survivors: Ints | None = None
        #: Plugin → its ``prepare(view)`` result (set by the runner).
        self.prepared: Mapping[object, Any] = NOTHING_PREPARED

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def survivors(self) -> Ints:
        """Positions of the alive candidates, ascending (fixed once the filters ran)."""
        if self._survivors is not None:
            return self._survivors
        return self.alive.nonzero()[0]

    def seal(self, survivors: Ints | None = None) -> None:
        """The filters are done: ``alive`` no longer changes (``survivors``: its
        positions, when the caller has them)."""
        self._survivors = self.alive.nonzero()[0] if survivors is None else survivors

    def rng(self, seed: int) -> random.Random:
        """The request's random source: :func:`request_rng` of the request."""
        return random.Random(f"{seed}:{self.request.request_id}")


#: :attr:`Batch.prepared` before the runner sets it (read-only, shared).
NOTHING_PREPARED: Mapping[object, Any] = MappingProxyType({})


class Removal(NamedTuple):
    """What a filter removes — a mask over every position (only alive ones count) — and
    why, per position, worked out only for a trace."""

    mask: Bools
    reason: Callable[[int], str]


def removal_where(batch: Batch, why: Callable[[int], str | None]) -> Removal | None:
    """The easy way to write a filter over a few candidates: ``why(position)`` of each
    survivor, None keeping it; None when nothing is removed."""
    reasons: dict[int, str] = {}
    positions = range(len(batch.ids)) if batch.all_alive else batch.survivors.tolist()
    for position in positions:
        reason = why(position)
        if reason is not None:
            reasons[position] = reason
    if not reasons:
        return None
    mask = np.zeros(len(batch.ids), dtype=np.bool_)
    mask[list(reasons)] = True
    return Removal(mask, reasons.__getitem__)


# ---------------------------------------------------------------------------- plugins


@runtime_checkable
class Filter(Protocol):
    """Removes candidates that must not serve the request (residency, health, model...)."""

    capabilities: ClassVar[frozenset[StrEnum]]

    @property
    def name(self) -> str: ...

    def removes(self, batch: Any, /) -> Removal | None: ...


@runtime_checkable
class Scorer(Protocol):
    """Rates each position in [0, 1], higher is better (a float per position)."""

    capabilities: ClassVar[frozenset[StrEnum]]

    @property
    def name(self) -> str: ...

    def scores(self, batch: Any, /) -> Floats | Sequence[float]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses one position among ``batch.survivors`` given every position's total."""

    capabilities: ClassVar[frozenset[StrEnum]]

    @property
    def name(self) -> str: ...

    def pick(self, batch: Any, totals: Floats, /) -> int: ...


@runtime_checkable
class CostModel(Protocol):
    """Predicts the request's time-to-first-token at each position, in ms (inf: cannot
    serve). The profile reports the choice's as ``Decision.predicted_ttft_ms``; a scorer
    that ranks by predicted TTFT usually is the cost model too (one object)."""

    capabilities: ClassVar[frozenset[StrEnum]]

    @property
    def name(self) -> str: ...

    def costs_ms(self, batch: Any, /) -> Floats | Sequence[float]: ...

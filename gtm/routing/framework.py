"""Contracts of the routing pipeline: filter → score → pick (ARCHITECTURE §3).

Every tier routes with the same three extension points, after the Kubernetes Gateway API
Inference Extension scheduler ("0845 scheduler architecture proposal") and llm-d:

* a :class:`Filter` removes candidates and says why, for each one it removes;
* a :class:`Scorer` gives each surviving candidate a value in [0, 1] (the runner clamps,
  and repairs NaN to 0); weights live in the profile, not in the scorer;
* exactly one :class:`Picker` chooses among the scored survivors.

Plugins are generic over the candidate type ``C`` (a tier's view of a region, a zone or a
GPU; all the framework needs is ``.id``) and the context ``X`` (the tier's immutable
snapshot). Decisions are sans-io: plugins are synchronous, never await, never do I/O, and
never mutate the request, the candidates or the context.

Determinism. The fleet simulator and the live tiers run the same decision code, so the
same request over the same snapshot must give the same choice. Plugins therefore take
no randomness from the global :mod:`random` state or the time: a picker that randomises
is given an :data:`RngFactory` at construction and derives a :class:`random.Random` per
request from ``(seed, request_id)`` with :func:`request_rng`. It draws only through
``Random.random()``, the one method whose sequence Python guarantees across versions for
a given seed (Python docs, ``random`` — "Notes on Reproducibility"). Candidate order is
part of the input: snapshots list candidates in a stable order (by id), and the runner
keeps that order through every filter.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, NamedTuple, Protocol, TypeVar, runtime_checkable

from gtm.models import RouteRequest


class Candidate(Protocol):
    """Anything a tier routes to. Ids are unique within one decision."""

    @property
    def id(self) -> str: ...


C = TypeVar("C", bound=Candidate)
C_contra = TypeVar("C_contra", bound=Candidate, contravariant=True)
X_contra = TypeVar("X_contra", contravariant=True)


class ExtensionPoint(StrEnum):
    """Where a plugin runs in a decision; the ``extension_point`` metric label."""

    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    COST_MODEL = "cost_model"


# ---------------------------------------------------------------------------- filters


@dataclass(frozen=True, slots=True)
class FilterResult(Generic[C]):
    """What a filter kept, in input order, and ``(candidate id, reason)`` per removal.

    Every input candidate is either kept or removed; the runner checks the counts add up.
    """

    kept: tuple[C, ...]
    removed: tuple[tuple[str, str], ...] = ()

    @classmethod
    def keep_all(cls, candidates: Sequence[C]) -> FilterResult[C]:
        return cls(tuple(candidates))


def partition(candidates: Sequence[C], why_removed: Callable[[C], str | None]) -> FilterResult[C]:
    """Split candidates with ``why_removed(candidate)``: ``None`` keeps it, a string removes it.

    The easy way to write a filter; a filter on a hot path may build its
    :class:`FilterResult` directly.
    """
    kept: list[C] = []
    removed: list[tuple[str, str]] = []
    for candidate in candidates:
        reason = why_removed(candidate)
        if reason is None:
            kept.append(candidate)
        else:
            removed.append((candidate.id, reason))
    return FilterResult(tuple(kept), tuple(removed))


@runtime_checkable
class Filter(Protocol[C, X_contra]):
    """Removes candidates that must not serve the request (residency, health, model...)."""

    @property
    def name(self) -> str: ...

    def filter(
        self, request: RouteRequest, candidates: Sequence[C], ctx: X_contra, /
    ) -> FilterResult[C]: ...


# ---------------------------------------------------------------------------- scorers


@runtime_checkable
class Scorer(Protocol[C_contra, X_contra]):
    """Rates each candidate in [0, 1], higher is better.

    Returns candidate id → score. The runner clamps to [0, 1]; NaN and missing ids become
    0. Each repair is counted and traced, because it means the scorer has a bug.
    """

    @property
    def name(self) -> str: ...

    def score(
        self, request: RouteRequest, candidates: Sequence[C_contra], ctx: X_contra, /
    ) -> Mapping[str, float]: ...


@runtime_checkable
class CostModel(Protocol[C_contra, X_contra]):
    """Predicts the request's time-to-first-token at a candidate, in ms (ARCHITECTURE §2).

    A profile with a cost model reports the chosen candidate's cost as
    ``Decision.predicted_ttft_ms``. A scorer that ranks by predicted TTFT usually is the
    cost model too: one object, referenced as both.
    """

    @property
    def name(self) -> str: ...

    def cost_ms(self, request: RouteRequest, candidate: C_contra, ctx: X_contra, /) -> float: ...


# ---------------------------------------------------------------------------- pickers


class Scored(NamedTuple, Generic[C]):
    """A surviving candidate and its weighted total score in [0, 1]."""

    candidate: C
    total: float


@runtime_checkable
class Picker(Protocol[C]):
    """Chooses one candidate among the scored survivors (never given an empty sequence)."""

    @property
    def name(self) -> str: ...

    def pick(self, request: RouteRequest, scored: Sequence[Scored[C]], /) -> C: ...


#: Builds the per-request random source of a randomised picker from (request, seed).
RngFactory = Callable[[RouteRequest, int], random.Random]


def request_rng(request: RouteRequest, seed: int = 0) -> random.Random:
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


def better(a: Scored[C], b: Scored[C]) -> Scored[C]:
    """The higher total; on a tie the smaller id, so the outcome never depends on order."""
    if a.total != b.total:
        return a if a.total > b.total else b
    return a if a.candidate.id <= b.candidate.id else b

"""Small candidates, batches and plugins for the routing framework's tests."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field

import numpy as np

from gtm.models import RouteRequest
from gtm.routing import Batch, Plugin, Removal, removal_where
from gtm.routing.framework import Floats


@dataclass(frozen=True, slots=True)
class Node:
    """A stand-in candidate."""

    id: str
    load: float = 0.0
    healthy: bool = True


class NodeBatch(Batch):
    """A stand-in tier layout: nodes by position; ``allowed`` feeds the allow-list filter."""

    __slots__ = ("allowed", "nodes")

    request: RouteRequest

    def __init__(
        self,
        nodes: Sequence[Node],
        request: RouteRequest,
        allowed: Set[str] | None = None,
        view: object = None,
    ) -> None:
        super().__init__(tuple(n.id for n in nodes), request, view)
        self.nodes = tuple(nodes)
        self.allowed = allowed

    def allowed_ids(self) -> Set[str] | None:
        return self.allowed


def nodes(*ids: str) -> tuple[Node, ...]:
    return tuple(Node(i) for i in ids)


def request(request_id: str = "req-1") -> RouteRequest:
    return RouteRequest(request_id=request_id, model="m", input_tokens=100, tenant="t")


def batch(
    *items: Node | str, allowed: Set[str] | None = None, req: RouteRequest | None = None
) -> NodeBatch:
    given = [Node(i) if isinstance(i, str) else i for i in items]
    return NodeBatch(given, req or request(), allowed)


def pick(
    picker: object, pairs: Sequence[tuple[str, float]], req: RouteRequest | None = None
) -> str:
    """The id ``picker`` chooses among ``(id, total)`` survivors."""
    chosen = batch(*(cid for cid, _ in pairs), req=req)
    totals = np.array([total for _, total in pairs], dtype=np.float64)
    position: int = picker.pick(chosen, totals)  # type: ignore[attr-defined]
    return chosen.ids[position]


@dataclass
class PredicateFilter(Plugin):
    """Removes nodes for which ``why`` returns a reason; records the survivors it saw."""

    name: str
    why: Callable[[Node], str | None]
    seen: list[tuple[str, ...]] = field(default_factory=list)

    def removes(self, batch: NodeBatch, /) -> Removal | None:
        self.seen.append(tuple(batch.ids[k] for k in batch.survivors.tolist()))
        return removal_where(batch, lambda k: self.why(batch.nodes[k]))


def drop(*ids: str, name: str = "drop", reason: str = "dropped") -> PredicateFilter:
    return PredicateFilter(name, lambda c: reason if c.id in ids else None)


@dataclass
class FixedScorer(Plugin):
    """Returns the given values as they are (NaN where none is given)."""

    name: str
    values: Mapping[str, float]

    def scores(self, batch: NodeBatch, /) -> Floats:
        return np.array([self.values.get(i, math.nan) for i in batch.ids], dtype=np.float64)


@dataclass
class LoadScorer(Plugin):
    """1 − load: lightly loaded nodes score higher."""

    name: str = "load"

    def scores(self, batch: NodeBatch, /) -> list[float]:
        return [1.0 - n.load for n in batch.nodes]


@dataclass
class LoadCost(Plugin):
    """A cost model: 100 ms per unit of load (infinite for an unhealthy node)."""

    name: str = "load-cost"

    def costs_ms(self, batch: NodeBatch, /) -> list[float]:
        return [100.0 * n.load if n.healthy else math.inf for n in batch.nodes]


@dataclass
class FakeTimer:
    """A timer that advances ``step`` seconds on every read."""

    step: float = 2.0**-20  # ≈ 1 µs, exact in binary so sums compare exactly
    now: float = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now

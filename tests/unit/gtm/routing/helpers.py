"""Small candidates, contexts and plugins for the routing framework's tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from gtm.models import RouteRequest
from gtm.routing import FilterResult, Scored, partition


@dataclass(frozen=True, slots=True)
class Node:
    """A stand-in candidate: anything with an ``id`` can be routed to."""

    id: str
    load: float = 0.0
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Ctx:
    """A stand-in snapshot; ``allowed`` feeds the allow-list filter's context source."""

    allowed: frozenset[str] | None = None

    def allowed_ids(self, request: RouteRequest, /) -> Set[str] | None:
        return self.allowed


def nodes(*ids: str) -> tuple[Node, ...]:
    return tuple(Node(i) for i in ids)


def request(request_id: str = "req-1") -> RouteRequest:
    return RouteRequest(request_id=request_id, model="m", input_tokens=100, tenant="t")


def scored(*pairs: tuple[str, float]) -> list[Scored[Node]]:
    return [Scored(Node(cid), total) for cid, total in pairs]


@dataclass
class PredicateFilter:
    """Removes candidates for which ``why`` returns a reason; records what it was shown."""

    name: str
    why: Callable[[Node], str | None]
    seen: list[tuple[str, ...]] = field(default_factory=list)

    def filter(
        self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /
    ) -> FilterResult[Node]:
        self.seen.append(tuple(c.id for c in candidates))
        return partition(candidates, self.why)


def drop(*ids: str, name: str = "drop", reason: str = "dropped") -> PredicateFilter:
    return PredicateFilter(name, lambda c: reason if c.id in ids else None)


@dataclass
class FixedScorer:
    """Returns the given values as they are (for the runner's clamping and weighting)."""

    name: str
    values: Mapping[str, float]

    def score(
        self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /
    ) -> Mapping[str, float]:
        return self.values


@dataclass
class LoadScorer:
    """1 − load: lightly loaded candidates score higher."""

    name: str = "load"

    def score(
        self, request: RouteRequest, candidates: Sequence[Node], ctx: Ctx, /
    ) -> Mapping[str, float]:
        return {c.id: 1.0 - c.load for c in candidates}


@dataclass
class LoadCost:
    """A cost model: 100 ms per unit of load (infinite for an unhealthy node)."""

    name: str = "load-cost"

    def cost_ms(self, request: RouteRequest, candidate: Node, ctx: Ctx, /) -> float:
        return 100.0 * candidate.load if candidate.healthy else float("inf")


@dataclass
class FakeTimer:
    """A timer that advances ``step`` seconds on every read."""

    step: float = 2.0**-20  # ≈ 1 µs, exact in binary so sums compare exactly
    now: float = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now

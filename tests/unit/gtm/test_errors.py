"""gtm.errors: a refusal's trace may be given as a function, built once when first read."""

from __future__ import annotations

from gtm.errors import NoEligibleCandidate, RoutingError
from gtm.models import DecisionTrace


def test_a_refusal_trace_given_as_a_function_is_built_once_when_read() -> None:
    built: list[DecisionTrace] = []

    def trace() -> DecisionTrace:
        built.append(DecisionTrace(profile="p", candidates=("a",)))
        return built[-1]

    refusal = NoEligibleCandidate("health", "removed all 1", trace=trace)
    assert isinstance(refusal, RoutingError)
    assert str(refusal) == "no eligible candidate left after filter 'health': removed all 1"
    assert built == []
    assert refusal.trace is refusal.trace is built[0]
    assert len(built) == 1
    assert NoEligibleCandidate("health").trace is None
    given = DecisionTrace(profile="p", candidates=())
    assert NoEligibleCandidate("health", trace=given).trace is given

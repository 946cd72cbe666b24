from __future__ import annotations

import pytest

from regional_lb.priority import OVERPROVISIONING_FACTOR, PANIC_THRESHOLD, health, split


def test_envoy_defaults() -> None:
    assert OVERPROVISIONING_FACTOR == 1.4
    assert PANIC_THRESHOLD == 0.5


@pytest.mark.parametrize(
    ("local", "peers", "expected_local", "panic"),
    [
        ((10, 10), (10, 10), 1.0, False),  # healthy: everything stays
        ((3, 4), (10, 10), 1.0, False),  # 75 % x 1.4 > 100 %: still everything
        ((5, 7), (10, 10), 1.0, False),  # 71.4 % x 1.4 = 100 %: the edge
        ((1, 2), (10, 10), 0.7, False),  # 50 % x 1.4 = 70 % stays
        ((1, 4), (10, 10), 0.35, False),  # 25 %: 35 % stays, no panic (peers cover it)
        ((1, 4), (0, 0), 1.0, True),  # nowhere to go: all stays, in panic
        ((1, 4), (1, 4), 0.5, True),  # both at 35 %: normalised, local panics
        ((0, 4), (0, 4), 1.0, True),  # nothing healthy anywhere
        ((0, 0), (10, 10), 0.0, False),  # no local capacity at all
    ],
)
def test_split(
    local: tuple[int, int], peers: tuple[int, int], expected_local: float, panic: bool
) -> None:
    result = split(local, peers)
    assert result.local_load == pytest.approx(expected_local)
    assert result.local_load + result.spill_load == pytest.approx(1.0)
    assert result.local_panic is panic
    assert result.degraded is (result.spill_load > 0)


def test_health_is_clamped() -> None:
    assert health(5, 0) == 0.0
    assert health(7, 5) == 1.0
    assert health(-1, 5) == 0.0

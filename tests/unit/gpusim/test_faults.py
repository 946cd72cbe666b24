from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpusim.faults import FaultInjector, Faults, is_loopback


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("fe80::1%eth0", False),
        ("10.0.0.5", False),
        ("::ffff:10.0.0.5", False),
        ("2001:db8::1", False),
        ("not an address", False),
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(peer: str | None, expected: bool) -> None:
    assert is_loopback(peer) is expected


def test_partial_updates_merge_and_clear_resets() -> None:
    injector = FaultInjector(seed=1)
    assert not injector.faults.active
    changes = Faults.model_validate({"error_rate": 0.5})
    injector.update(changes, set(changes.model_fields_set))
    changes = Faults.model_validate({"slowdown": 3.0})
    faults = injector.update(changes, set(changes.model_fields_set))
    assert (faults.error_rate, faults.slowdown) == (0.5, 3.0)
    assert faults.active
    assert injector.clear() == Faults()


def test_error_choices_are_deterministic_per_seed() -> None:
    def draws(seed: int) -> list[bool]:
        injector = FaultInjector(seed)
        changes = Faults(error_rate=0.5)
        injector.update(changes, {"error_rate"})
        return [injector.should_fail() for _ in range(64)]

    assert draws(4) == draws(4)
    assert draws(4) != draws(5)
    assert 10 < sum(draws(4)) < 54
    assert not FaultInjector(0).should_fail()  # no fault, no failure


@pytest.mark.parametrize(
    "body",
    [
        {"error_rate": 1.5},
        {"error_status": 418},
        {"slowdown": 0.5},
        {"added_latency_ms": -1},
        {"stop_stream_after": -2},
        {"hang": "yes please"},
        {"unknown": 1},
    ],
)
def test_invalid_faults_are_rejected(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Faults.model_validate(body)

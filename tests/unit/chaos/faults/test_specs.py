"""The fault specs: every kind parses from YAML, round-trips, is frozen; bad input gives
one clear message naming the field (and where the fault is, when the caller says)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from chaos.faults import (
    AllHealthChecksFailFault,
    DrainFault,
    GpuFault,
    GpuFaultMode,
    Injected,
    KillFault,
    LatencyFault,
    PartitionFault,
    PartitionMode,
    fault_kinds,
    parse_fault,
)
from chaos.faults.network import Direction
from global_lb.health import HealthCheckConfig
from gtm.errors import ConfigError

EXAMPLES = """
- {kind: kill, tier: regional/eu-west}
- {kind: kill, tier: global}
- {kind: pause, tier: gpu/eu-west-a-h100-1}
- {kind: etcd-kill-leader}
- {kind: etcd-stop}
- {kind: etcd-compact, keep: 10}
- {kind: gpu-fault, gpu: eu-west-a-h100-1, mode: slow, slowdown: 4}
- {kind: gpu-fault, gpu: eu-west-a-h100-1, mode: errors, error_rate: 0.5, error_status: 503}
- {kind: gpu-fault, gpu: eu-west-a-h100-1, mode: black-hole}
- {kind: drain, region: eu-west}
- {kind: drain, zone: eu-west-a}
- {kind: partition, source: zone/eu-west-a, target: "etcd/*"}
- {kind: partition, source: global, target: regional/eu-west, mode: refuse}
- {kind: latency, source: global, target: regional/eu-west, latency_ms: 500, jitter_ms: 200}
- {kind: all-health-checks-fail}
- {kind: policy-push, paths: [bad-policies/]}
"""


def examples() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(EXAMPLES)
    assert isinstance(loaded, list)
    return loaded


@pytest.mark.parametrize("data", examples(), ids=lambda d: str(d["kind"]))
def test_each_example_parses_and_round_trips(data: dict[str, Any]) -> None:
    spec = parse_fault(data)
    assert spec.kind == data["kind"]
    assert parse_fault(spec.model_dump(mode="json")) == spec


def test_the_examples_cover_every_kind() -> None:
    assert {d["kind"] for d in examples()} == set(fault_kinds())


def test_specs_are_frozen() -> None:
    spec = parse_fault({"kind": "kill", "tier": "global"})
    assert isinstance(spec, KillFault)
    with pytest.raises(ValidationError, match="frozen"):
        spec.tier = "regional/eu-west"  # type: ignore[misc]


def test_defaults() -> None:
    partition = parse_fault({"kind": "partition", "source": "global", "target": "regional/*"})
    assert isinstance(partition, PartitionFault)
    assert partition.mode is PartitionMode.BLACK_HOLE
    latency = parse_fault(
        {"kind": "latency", "source": "global", "target": "regional/x", "latency_ms": 5}
    )
    assert isinstance(latency, LatencyFault)
    assert latency.direction is Direction.BOTH
    assert latency.jitter_ms == 0
    health = parse_fault({"kind": "all-health-checks-fail"})
    assert isinstance(health, AllHealthChecksFailFault)
    assert health.latency_ms == 2 * HealthCheckConfig().timeout * 1000


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "explode"}, "fault.kind: unknown kind 'explode'; expected one of kill, pause"),
        ({"tier": "global"}, "fault.kind: missing; expected one of kill"),
        ({"kind": "kill"}, "fault.tier: Field required"),
        ({"kind": "kill", "tier": "global", "signal": 9}, "fault.signal: Extra inputs"),
        ({"kind": "kill", "tier": "eu-west"}, "fault.tier: 'eu-west' is not a tier: expected"),
        ({"kind": "kill", "tier": "regional/"}, "fault.tier: 'regional/' is not a tier"),
        ({"kind": "drain"}, "fault: drain needs exactly one of region, zone, gpu"),
        (
            {"kind": "drain", "region": "eu-west", "zone": "eu-west-a"},
            "fault: drain needs exactly one of region, zone, gpu (got region, zone)",
        ),
        ({"kind": "drain", "region": "eu west"}, "fault.region: 'eu west' is not a name"),
        (
            {"kind": "gpu-fault", "gpu": "g1", "mode": "melt"},
            "fault.mode: Input should be 'crash', 'slow'",
        ),
        (
            {"kind": "gpu-fault", "gpu": "g1", "mode": "slow", "slowdown": 0.5},
            "fault.slowdown: Input should be greater than or equal to 1",
        ),
        (
            {"kind": "gpu-fault", "gpu": "g1", "mode": "errors", "error_status": 404},
            "fault.error_status: Input should be 429, 500, 502, 503 or 504",
        ),
        (
            {"kind": "latency", "source": "global", "target": "regional/x"},
            "fault.latency_ms: Field required",
        ),
        (
            {"kind": "latency", "source": "global", "target": "x", "latency_ms": -1},
            "fault.latency_ms: Input should be greater than or equal to 0",
        ),
        (
            {"kind": "all-health-checks-fail", "latency_ms": 100},
            "fault.latency_ms: Input should be greater than 1000",
        ),
        ({"kind": "policy-push", "paths": []}, "fault.paths: Tuple should have at least 1 item"),
        ({"kind": "etcd-compact", "keep": -1}, "fault.keep: Input should be greater than or"),
        ("kill", "fault: Input should be a valid dictionary"),
    ],
)
def test_bad_specs_name_the_field(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_fault(data)
    assert str(raised.value).startswith(message), str(raised.value)


def test_the_caller_says_where_the_fault_is() -> None:
    with pytest.raises(ConfigError, match=r"^method\[2\]\.fault\.tier: Field required"):
        parse_fault({"kind": "pause"}, where="method[2].fault")


def test_yaml_with_a_bad_field_from_a_file_is_named() -> None:
    text = "kind: latency\nsource: global\ntarget: regional/eu-west\nlatency_ms: soon\n"
    with pytest.raises(ConfigError, match=r"fault\.latency_ms: Input should be a valid integer"):
        parse_fault(yaml.safe_load(text))


@pytest.mark.parametrize(
    ("mode", "body"),
    [
        (GpuFaultMode.CRASH, {"crash": True}),
        (GpuFaultMode.SLOW, {"slowdown": 4.0}),
        (GpuFaultMode.THROTTLE, {"thermal_throttle": True}),
        (GpuFaultMode.BLACK_HOLE, {"black_hole": True}),
        (GpuFaultMode.ERRORS, {"error_rate": 1.0, "error_status": 500}),
        (GpuFaultMode.LATENCY, {"added_latency_ms": 1000.0}),
        (GpuFaultMode.CUT_STREAM, {"stop_stream_after": 8}),
    ],
)
def test_gpu_fault_bodies_are_the_emulators_fault_fields(
    mode: GpuFaultMode, body: dict[str, object]
) -> None:
    from gpusim.faults import Faults

    fault = GpuFault(gpu="g1", mode=mode)
    assert fault.body() == body
    Faults.model_validate(fault.body())  # the emulator accepts it as is


def test_drain_target() -> None:
    assert DrainFault(zone="eu-west-a").target == ("zone", "eu-west-a")
    assert DrainFault(gpu="g1").target == ("gpu", "g1")


async def test_injected_rollback_runs_once() -> None:
    calls: list[int] = []

    async def undo() -> None:
        calls.append(1)

    injected = Injected("kill -9 global", undo)
    await injected.rollback()
    await injected.rollback()
    assert injected.rolled_back
    assert calls == [1]
    assert Injected("x").describe() == "x"

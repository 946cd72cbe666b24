"""Synthetic journals for the probe, report and runner tests."""

from __future__ import annotations

from chaos.journal import (
    DnsRecord,
    FaultAction,
    FaultRecord,
    Journal,
    Phase,
    PhaseRecord,
    RequestRecord,
)

#: 2023-11-14T22:13:20Z: a fixed wall-clock origin.
T0_WALL = 1_700_000_000.0


def journal(*, fault_at: float = 10.0, rollback_at: float = 20.0, end: float = 30.0) -> Journal:
    """Phases before [0, fault), during [fault, rollback), after [rollback, end); one
    fault step ``kill`` on eu-west; no requests or DNS answers yet."""
    j = Journal(t0_wall=T0_WALL)
    j.phases += [
        PhaseRecord(0.0, Phase.BEFORE),
        PhaseRecord(fault_at, Phase.DURING),
        PhaseRecord(rollback_at, Phase.AFTER),
        PhaseRecord(end, Phase.TEARDOWN),
    ]
    j.faults += [
        FaultRecord(
            fault_at, FaultAction.INJECT, "kill", "kill", "kill -9 regional/eu-west", ("eu-west",)
        ),
        FaultRecord(
            rollback_at,
            FaultAction.ROLLBACK,
            "kill",
            "kill",
            "kill -9 regional/eu-west",
            ("eu-west",),
        ),
    ]
    j.ended_at = end
    return j


def ok(
    at: float,
    region: str = "us-east",
    *,
    ttft: float = 0.1,
    attempts: int = 1,
    stream: str = "default",
    spilled_from: str = "",
) -> RequestRecord:
    return RequestRecord(at, at + 0.5, True, 200, "", ttft, region, spilled_from, attempts, stream)


def failed(
    at: float,
    status: int = 0,
    reason: str = "ClientConnectorError",
    *,
    attempts: int = 3,
    stream: str = "default",
) -> RequestRecord:
    return RequestRecord(at, at + 0.5, False, status, reason, None, "", "", attempts, stream)


def answer(at: float, *regions: str, name: str = "api.inference.example.") -> DnsRecord:
    return DnsRecord(at, name, "NOERROR", tuple(sorted(regions)))

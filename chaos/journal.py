"""What a game-day run records: every request, DNS answer, fault and phase change.

Times are seconds since the run's origin (``t0``) on the runner's monotonic clock, so the
probe arithmetic (:mod:`chaos.probes`) is exact and testable with a fake clock; the
journal also keeps the wall-clock time of the origin, so every event has a UTC
timestamp in ``journal.json`` and the summary's timeline.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    """The steady-state hypothesis is checked before the first fault (the gate), during
    the faults and after the last rollback (Chaos Toolkit's ``steady_states``)."""

    SETUP = "setup"
    BEFORE = "before"
    DURING = "during"
    AFTER = "after"
    TEARDOWN = "teardown"


class FaultAction(StrEnum):
    INJECT = "inject"
    ROLLBACK = "rollback"


class RunStatus(StrEnum):
    """Chaos Toolkit's journal status values."""

    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One logical request of the load (all of its client attempts)."""

    sent_at: float
    done_at: float
    ok: bool
    status: int
    reason: str = ""
    ttft_s: float | None = None
    region: str = ""
    spilled_from: str = ""
    attempts: int = 1
    #: Which load stream sent it (the tenant mix's label).
    stream: str = "default"
    #: Regions of earlier attempts that failed (a retry went elsewhere).
    failed_regions: tuple[str, ...] = ()
    #: The zone and GPU that served it (the answer's x-gtm-zone, x-gtm-gpu).
    zone: str = ""
    gpu: str = ""


@dataclass(frozen=True, slots=True)
class DnsRecord:
    at: float
    name: str
    rcode: str
    #: Regions of the A/AAAA answers (addresses mapped through the deployment), sorted.
    regions: tuple[str, ...]
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FaultRecord:
    at: float
    action: FaultAction
    #: The method step's id (``step-N`` when the file names none).
    step: str
    kind: str
    description: str
    #: Regions/zones/GPUs the fault takes away (what "the dead target" means for the
    #: failover-time probe).
    targets: tuple[str, ...] = ()
    error: str = ""
    #: The product refused the injection (a bad policy push rejected unwritten).
    refused: bool = False


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    at: float
    phase: Phase


@dataclass(frozen=True, slots=True)
class MetricRecord:
    """One sample of a tier's ``/metrics``, scraped at the end of the run (``at``)."""

    at: float
    #: ``global``, ``regional/<region>`` or ``zone/<zone>``.
    source: str
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True, slots=True)
class NoteRecord:
    """Anything else worth a line on the timeline (start-up, abort reasons, errors)."""

    at: float
    text: str


@dataclass(slots=True)
class Journal:
    """Append-only record of one run (mutated only by the runner that owns it)."""

    t0_wall: float
    requests: list[RequestRecord] = field(default_factory=list)
    dns: list[DnsRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    phases: list[PhaseRecord] = field(default_factory=list)
    notes: list[NoteRecord] = field(default_factory=list)
    #: Samples of the tiers' metrics the ``metric`` probes name (scraped once, at the end).
    metrics: list[MetricRecord] = field(default_factory=list)
    #: When the run ended (s since t0); None while it runs.
    ended_at: float | None = None

    def utc(self, at: float) -> str:
        """ISO 8601 UTC of a run time, to the millisecond."""
        stamp = datetime.fromtimestamp(self.t0_wall + at, tz=UTC)
        return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def phase_start(self, phase: Phase) -> float | None:
        return next((p.at for p in self.phases if p.phase is phase), None)

    def phase_window(self, phase: Phase) -> tuple[float, float] | None:
        """[start, end) of a phase; the last one ends when the run did (or never)."""
        for index, record in enumerate(self.phases):
            if record.phase is phase:
                end = (
                    self.phases[index + 1].at
                    if index + 1 < len(self.phases)
                    else (self.ended_at if self.ended_at is not None else float("inf"))
                )
                return record.at, end
        return None

    def injections(self, steps: Collection[str] | None = None) -> list[FaultRecord]:
        """The injections that went through (no error), of ``steps`` (None: every
        step), in order: the one reading of "this step was injected"."""
        return [
            f
            for f in self.faults
            if f.action is FaultAction.INJECT and not f.error and (steps is None or f.step in steps)
        ]

    def fault_windows(self) -> list[tuple[str, str, float, float]]:
        """(step, description, injected at, rolled back at) per injected step; a step
        never rolled back ends with the run."""
        end = self.ended_at if self.ended_at is not None else float("inf")
        windows: list[tuple[str, str, float, float]] = []
        for record in self.injections():
            back = next(
                (
                    r.at
                    for r in self.faults
                    if r.action is FaultAction.ROLLBACK and r.step == record.step
                ),
                end,
            )
            windows.append((record.step, record.description, record.at, back))
        return windows

    def to_json(self, header: dict[str, Any]) -> str:
        """``journal.json``: the header, then every event in time order with its UTC time."""
        events: list[tuple[float, str, dict[str, Any]]] = []
        for kind, records in (
            ("phase", self.phases),
            ("fault", self.faults),
            ("note", self.notes),
            ("dns", self.dns),
            ("request", self.requests),
            ("metric", self.metrics),
        ):
            for record in records:
                data = asdict(record)
                at = data.pop("sent_at", None)
                at = data.pop("at", at)
                events.append((float(at), kind, data))
        events.sort(key=lambda e: e[0])
        body = {
            **header,
            "t0_utc": self.utc(0.0),
            "ended_utc": None if self.ended_at is None else self.utc(self.ended_at),
            "events": [
                {"t": round(at, 4), "utc": self.utc(at), "type": kind, **data}
                for at, kind, data in events
            ],
        }
        return json.dumps(body, indent=1, default=str) + "\n"

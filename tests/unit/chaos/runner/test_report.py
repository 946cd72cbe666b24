"""The report: every criterion in the Markdown with value, tolerance and verdict; a valid
PNG; a journal with UTC times."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from chaos.journal import Journal, NoteRecord, RunStatus
from chaos.probes import FailoverTime, RequestsLost, SuccessRate, Window
from chaos.progress import status_line
from chaos.report import Environment, series, write_report
from chaos.scenario import Scenario
from tests.unit.chaos.runner.helpers import answer, failed, journal, ok

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ENVIRONMENT = Environment("0.1.0", "abc123", "3.11.2", "3.5.1", "Linux 6.1 (x86_64)", "test")


def _scenario() -> Scenario:
    return Scenario.model_validate(
        {
            "title": "Blackout",
            "description": "eu-west dies.",
            "load": {"duration_s": 30},
            "hypothesis": [
                {"probe": "success_rate", "window": "before", "min": 0.99},
                {"probe": "failover_time", "step": "kill", "max_s": 3},
                {"probe": "requests_lost", "window": "during", "max": 0},
            ],
            "method": [
                {
                    "id": "kill",
                    "at_s": 10,
                    "duration_s": 10,
                    "fault": {"kind": "kill", "tier": "regional/eu-west"},
                }
            ],
        }
    )


def _journal() -> Journal:
    j = journal(fault_at=10, rollback_at=20, end=30)
    j.requests += [ok(t / 2, "eu-west" if t % 3 else "us-east") for t in range(20)]
    j.requests += [ok(10.2, "eu-west"), failed(12.5, 502, "http-502"), ok(12.0, attempts=2)]
    j.requests += [ok(20 + t / 2) for t in range(20)]
    j.dns += [
        answer(9, "eu-west", "us-east"),
        answer(11, "eu-west"),
        answer(12, "us-east"),
        answer(21, "eu-west", "us-east"),
    ]
    j.notes.append(NoteRecord(-5.0, "deployment ready"))
    return j


def test_report_files(tmp_path: Path) -> None:
    scenario, j = _scenario(), _journal()
    results = [p.measure(j) for p in scenario.hypothesis]
    summary_path = write_report(
        tmp_path, scenario, "s.yaml", j, results, RunStatus.COMPLETED, ENVIRONMENT
    )
    summary = summary_path.read_text()
    assert "**Result: FAIL** — run completed, deviated: yes" in summary
    for m in results:
        assert f"| {m.name} | {m.value_text()} | {m.tolerance} |" in summary
    assert "| failover time after kill | 2.5 | ≤ 3 s | PASS |" in summary
    assert "| requests lost (during) | 1 | ≤ 0 | **FAIL** |" in summary
    assert "1 lost** (failed after every attempt), 2 retried (3 extra attempts" in summary
    assert "- Cut streams (broke after the first byte): 0\n" in summary
    assert "gtm 0.1.0, commit abc123; Python 3.11.2; etcd 3.5.1" in summary
    # The timeline is in UTC and shows DNS answer changes once each.
    assert "| 2023-11-14T22:13:30.000Z |   10.00 | inject `kill` (kill)" in summary
    assert "DNS `api.inference.example.` → NOERROR us-east (was eu-west)" in summary
    assert "| 2023-11-14T22:13:15.000Z |   -5.00 | deployment ready |" in summary
    assert '`{"kind": "kill", "tier": "regional/eu-west"}`' in summary
    png = (tmp_path / "timeline.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    width, height = struct.unpack(">II", png[16:24])
    assert width > 500
    assert height > 400
    body = json.loads((tmp_path / "journal.json").read_text())
    assert body["status"] == "completed"
    assert body["passed"] is False
    assert body["t0_utc"] == "2023-11-14T22:13:20.000Z"
    times = [e["t"] for e in body["events"]]
    assert times == sorted(times)
    kinds = {e["type"] for e in body["events"]}
    assert kinds == {"phase", "fault", "note", "dns", "request"}
    assert len([e for e in body["events"] if e["type"] == "request"]) == len(j.requests)


def test_a_passing_run_says_pass(tmp_path: Path) -> None:
    scenario = _scenario().model_copy(
        update={
            "hypothesis": (
                SuccessRate(min=0.9),
                FailoverTime(step="kill", max_s=3),
                RequestsLost(max=5, window=Window.DURING),
            )
        }
    )
    j = _journal()
    results = [p.measure(j) for p in scenario.hypothesis]
    summary = write_report(
        tmp_path, scenario, "s.yaml", j, results, RunStatus.COMPLETED, ENVIRONMENT
    ).read_text()
    assert "**Result: PASS**" in summary
    aborted = write_report(
        tmp_path, scenario, "s.yaml", j, results, RunStatus.ABORTED, ENVIRONMENT
    ).read_text()
    assert "**Result: FAIL** — run aborted" in aborted


def test_series_buckets() -> None:
    j = journal(end=3)
    j.requests += [ok(0.1, "a", ttft=0.1), failed(0.5), ok(1.5, "b", ttft=0.3), ok(1.7, "b")]
    data = series(j, bucket_s=1.0)
    assert data.t == [0.0, 1.0, 2.0, 3.0]
    assert data.success[:3] == [0.5, 1.0, None]
    assert data.per_region == {"a": [1.0, 0, 0, 0], "b": [0, 2.0, 0, 0]}
    assert data.p50_ms[0] == 100.0


def test_progress_line() -> None:
    j = _journal()
    line = status_line(j, 12.0, j.phases[1].phase, 3)
    assert "12.0 s" in line
    assert "during" in line
    assert "in flight 3" in line
    assert "faults: none" in line  # the fake journal rolled its fault back


def test_cut_streams_have_their_own_line_and_reasons(tmp_path: Path) -> None:
    scenario, j = _scenario(), _journal()
    j.requests += [
        failed(13.0, 200, "stream-error:upstream_reset", attempts=1),
        failed(13.5, 200, "stream-error:upstream_reset", attempts=1),
        failed(14.0, 200, "cut-stream:ClientPayloadError", attempts=1),
    ]
    results = [p.measure(j) for p in scenario.hypothesis]
    summary = write_report(
        tmp_path, scenario, "s.yaml", j, results, RunStatus.COMPLETED, ENVIRONMENT
    ).read_text()
    assert "200 stream-error:upstream_reset ×2" in summary
    assert (
        "- Cut streams (broke after the first byte): 3 (stream-error:upstream_reset ×2, "
        "cut-stream:ClientPayloadError ×1)"
    ) in summary

"""The fast subset of the failover suite through real processes: ``gtm up --processes``
with a real etcd, real HTTP load through the front door, real DNS over UDP, real kills.

Each scenario tagged ``fast`` in chaos/scenarios runs once, start to report; the test
asserts the run completed, every criterion passed, and the report holds every criterion
(``make chaos`` runs the whole suite)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from chaos.journal import RunStatus
from chaos.runner import RunOptions, ScenarioRun
from chaos.scenario import load_scenario
from gtm.clock import SystemClock

SCENARIOS = Path(__file__).resolve().parents[4] / "chaos" / "scenarios"
FAST = sorted(p for p in SCENARIOS.glob("*.yaml") if load_scenario(p)[0].fast)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", FAST, ids=lambda p: p.stem)
async def test_fast_scenario(path: Path, tmp_path: Path) -> None:
    scenario, topology = load_scenario(path)
    out = io.StringIO()
    options = RunOptions(report_dir=tmp_path / "report", run_dir=tmp_path / "run")
    run = ScenarioRun(scenario, str(path), topology, options, clock=SystemClock(), out=out)
    outcome = await run.run()
    summary = outcome.summary.read_text("utf-8")
    failed = [
        f"{m.name}: {m.value_text()} ({m.tolerance}) {m.detail}"
        for m in outcome.results
        if not m.passed
    ]
    assert outcome.status is RunStatus.COMPLETED, summary
    assert failed == [], summary
    assert outcome.passed
    for m in outcome.results:
        assert f"| {m.name} | {m.value_text()} | {m.tolerance} | PASS |" in summary
    journal = json.loads((tmp_path / "report" / "journal.json").read_text("utf-8"))
    injected = [e for e in journal["events"] if e["type"] == "fault" and e["action"] == "inject"]
    rolled_back = [
        e for e in journal["events"] if e["type"] == "fault" and e["action"] == "rollback"
    ]
    assert len(injected) == len(scenario.method)
    assert {e["step"] for e in rolled_back} == {e["step"] for e in injected}
    assert all(not e["error"] for e in injected + rolled_back)
    requests = [e for e in journal["events"] if e["type"] == "request"]
    assert len(requests) > 50
    assert (tmp_path / "report" / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "inject" in out.getvalue()

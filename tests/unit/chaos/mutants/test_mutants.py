"""The mutation suite's pieces: the catalogue, each patch applied the way a deployment's
processes apply it (``sitecustomize`` on the ``PYTHONPATH``), each policy edit, the
scenario field that names mutants, and the matrix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from chaos.cli import chaos
from chaos.mutants import MUTANT_ENV, MUTANTS, SITE_DIR, Mutant, UnknownMutant, mutant
from chaos.mutants.patches import PATCHES
from chaos.mutants.policy import POLICY_EDITS, PolicyEditError, no_quota, write_policies
from chaos.mutants.suite import Cell, CellResult, judge, matrix_markdown, write_matrix
from chaos.scenario import load_scenario
from policies import load_paths
from policies.documents import Quotas, SaturationPolicy

ROOT = Path(__file__).resolve().parents[4]
SCENARIOS = sorted((ROOT / "chaos" / "scenarios").glob("*.yaml"))

#: What each patch replaces: an expression evaluated after the product module's import,
#: in a process started the way ``gtm chaos run --mutant`` starts the deployment.
TARGETS = {
    "health-checks-pass": "global_lb.health.HttpProber.probe",
    "no-fail-open": "global_lb.health.HealthChecker._all_down",
    "no-failback": "global_lb.health.HealthChecker._apply",
    "impatient-health-checks": "global_lb.health.HttpProber.__init__",
    "gpu-health-ignored": "zone_agent.health.HealthTracker._eject",
    "scrape-round-waits-for-all": "zone_agent.app.ZoneAgent.scrape_round",
    "no-retry-before-first-byte": "gtm.relay.Relay.__init__",
    "region-needs-every-zone": "regional_lb.app.build_summary",
    "snapshot-dropped": "gtm.state.snapshot.SnapshotWatcher._mark_stale",
    "watch-ends-on-compaction": "gtm.state.snapshot.SnapshotWatcher._follow",
    "lenient-policy-loader": "policies.loader.validate_document",
    "no-burst-allowance": "regional_lb.quota.QuotaLimiter.__init__",
}


def _run_with(name: str | None, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != MUTANT_ENV}
    if name is not None:
        env.update(mutant(name).environment(env))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_every_patch_has_a_target_and_a_mutant() -> None:
    assert set(TARGETS) == set(PATCHES)
    patched = {m.patch for m in MUTANTS.values() if m.patch is not None}
    edited = {m.policy for m in MUTANTS.values() if m.policy is not None}
    assert patched == set(PATCHES)
    assert edited == set(POLICY_EDITS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_patch_replaces_its_target_in_a_deployment_process(name: str) -> None:
    target = TARGETS[name]
    module = ".".join(p for p in target.split(".") if p.islower() or p.startswith("_"))
    module = module.rsplit(".", 1)[0] if module.endswith(target.rsplit(".", 1)[1]) else module
    code = f"import {module}; print({target}.__qualname__)"
    qualname = _run_with(name, code)
    function = name.replace("-", "_")
    assert qualname.startswith(f"{function}.<locals>."), qualname
    # Without the mutant, the same process has the product's own function.
    assert not _run_with(None, code).startswith(f"{function}.<locals>.")


def test_gpu_health_ignored_keeps_a_failing_gpu_eligible() -> None:
    code = """
from zone_agent.health import HealthTracker, Outcome
t = HealthTracker()
t.observe_check("g", True, 0.0)
for i in range(10):
    t.observe_check("g", False, float(i))
    t.record("g", Outcome.TIMEOUT, float(i))
print(t.status("g", 10.0).eligible)
"""
    assert _run_with("gpu-health-ignored", code) == "True"
    assert _run_with(None, code) == "False"


def test_lenient_policy_loader_accepts_the_typo_the_loader_must_reject() -> None:
    path = ROOT / "chaos" / "scenarios" / "policies" / "unknown-field.yaml"
    code = f"""
from policies import load_paths
try:
    load_paths([{str(path)!r}])
    print("accepted")
except Exception as exc:
    print(type(exc).__name__)
"""
    assert _run_with("lenient-policy-loader", code) == "accepted"
    assert _run_with(None, code) == "PolicyValidationError"


def test_a_policy_mutant_needs_no_environment() -> None:
    assert mutant("no-spill").environment({"PYTHONPATH": "/x"}) == {}
    env = mutant("no-fail-open").environment({"PYTHONPATH": "/x"})
    assert env == {MUTANT_ENV: "no-fail-open", "PYTHONPATH": f"{SITE_DIR}{os.pathsep}/x"}
    assert (SITE_DIR / "sitecustomize.py").is_file()


def test_unknown_mutants_and_malformed_ones_are_refused() -> None:
    with pytest.raises(UnknownMutant, match=r"known: .*no-spill"):
        mutant("no-such-thing")
    with pytest.raises(ValidationError, match="exactly one of policy, patch"):
        Mutant(name="x", breaks="y")
    with pytest.raises(ValidationError, match="no patch"):
        Mutant(name="x", breaks="y", patch="nothing")


def test_policy_edits(tmp_path: Path) -> None:
    sets = {name: load_paths([write_policies(name, tmp_path / name)]) for name in POLICY_EDITS}
    assert [r.name for r in sets["residency-off"].rules] == ["default-anywhere"]
    assert sets["no-spill"].settings.on_saturation is SaturationPolicy.REJECT
    assert all(t.quotas == Quotas() for t in sets["no-quota"].tenants.values())
    # The load-test tenant gtm up adds to the examples is there too.
    assert len(sets["no-quota"].tenants) == len(sets["no-spill"].tenants) > 3
    profile = sets["regional-random-zone"].profiles["regional-default"]
    assert (profile.scorers, profile.picker) == ((), "mutant-random")
    # The unedited files are the examples as shipped.
    assert (tmp_path / "no-spill" / "tenants.yaml").read_text() == (
        ROOT / "policies" / "examples" / "tenants.yaml"
    ).read_text()


def test_a_policy_edit_that_finds_nothing_to_edit_fails() -> None:
    with pytest.raises(PolicyEditError, match="no tenant has quotas"):
        no_quota({"kind": "Tenants", "spec": {"tenants": [{"id": "a"}]}})


def test_every_scenario_names_its_mutants() -> None:
    assert len(SCENARIOS) >= 16
    for path in SCENARIOS:
        scenario, _ = load_scenario(path)
        assert scenario.mutants, path.name
        assert all(name in MUTANTS for name in scenario.mutants)


def test_a_scenario_naming_an_unknown_mutant_is_invalid(tmp_path: Path) -> None:
    path = _copy(tmp_path, "mutants: [regional-random-zone]", "mutants: [nope]")
    result = CliRunner().invoke(chaos, ["run", "--check", str(path)])
    assert result.exit_code == 2
    assert "unknown mutants ['nope']" in result.output


def test_run_refuses_an_unknown_mutant_and_attach() -> None:
    path = str(ROOT / "chaos" / "scenarios" / "slow-gpu.yaml")
    result = CliRunner().invoke(chaos, ["run", path, "--mutant", "nope", "--check"])
    assert result.exit_code == 2
    assert "unknown mutant 'nope'" in result.output
    result = CliRunner().invoke(
        chaos, ["run", path, "--mutant", "no-spill", "--attach", "http://127.0.0.1:1"]
    )
    assert result.exit_code == 2
    assert "not with --attach" in result.output


def _report(directory: Path, *, passed: bool, status: str, failed: list[str]) -> Path:
    directory.mkdir(parents=True)
    results = [{"name": n, "passed": False} for n in failed] + [{"name": "ok", "passed": True}]
    header = {"status": status, "passed": passed, "results": results, "events": []}
    (directory / "journal.json").write_text(json.dumps(header))
    return directory


def test_judge_reads_a_cell_from_its_report(tmp_path: Path) -> None:
    caught = judge("s", "m", _report(tmp_path / "a", passed=False, status="completed",
                                     failed=["spilled requests"]))  # fmt: skip
    assert caught == CellResult("s", "m", Cell.CAUGHT, "completed", ("spilled requests",))
    survived = judge("s", "m", _report(tmp_path / "b", passed=True, status="completed", failed=[]))
    assert survived.cell is Cell.SURVIVED
    aborted = judge("s", "m", _report(tmp_path / "c", passed=False, status="aborted", failed=[]))
    assert aborted.cell is Cell.CAUGHT
    missing = judge("s", "m", tmp_path / "none")
    assert (missing.cell, missing.status) == (Cell.ERROR, "no report: FileNotFoundError")


def test_the_matrix_has_a_row_per_scenario_and_a_column_per_mutant(tmp_path: Path) -> None:
    results = [
        CellResult("zone-loss", "no-retry-before-first-byte", Cell.CAUGHT, "completed", ("x",)),
        CellResult("zone-loss", "region-needs-every-zone", Cell.SURVIVED, "completed"),
        CellResult("etcd-down", "snapshot-dropped", Cell.CAUGHT, "aborted"),
    ]
    text = matrix_markdown(results)
    assert (
        "| scenario | no-retry-before-first-byte | region-needs-every-zone | snapshot-dropped |"
        in text
    )
    assert "| etcd-down |  |  | caught (aborted) |" in text
    assert "| zone-loss | caught | SURVIVED |  |" in text
    path = write_matrix(results, tmp_path)
    assert path.read_text() == text
    assert json.loads((tmp_path / "matrix.json").read_text())[1]["cell"] == "SURVIVED"


def _copy(tmp_path: Path, old: str, new: str) -> Path:
    """slow-gpu.yaml with ``old`` replaced, its topology path made absolute."""
    folder = ROOT / "chaos" / "scenarios"
    text = (folder / "slow-gpu.yaml").read_text().replace(old, new)
    text = text.replace("topologies/small.yaml", str(folder / "topologies" / "small.yaml"))
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_mutants_command_refuses_a_scenario_without_mutants(tmp_path: Path) -> None:
    path = _copy(tmp_path, "mutants: [regional-random-zone]", "")
    result = CliRunner().invoke(chaos, ["mutants", str(path), "--report", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "names no mutant" in result.output

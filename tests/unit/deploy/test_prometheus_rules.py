"""The alert rules (deploy/prometheus/gtm-alerts.yaml) load, and their unit tests pass
under ``promtool test rules`` (Debian's ``prometheus``, scripts/install-system-deps: a
missing promtool fails here, it does not skip)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "gtm-alerts.yaml"
TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yaml"))
#: What every alert must say (labels and annotations an on-call engineer reads).
ANNOTATIONS = {"summary", "description", "runbook"}
SEVERITIES = {"critical", "warning", "info"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "promtool not found: install Debian's prometheus (scripts/install-system-deps)"
    return subprocess.run(
        [found, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def alerts() -> list[dict[str, object]]:
    document = yaml.safe_load(RULES.read_text("utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_the_rules_load() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", TESTS, ids=[p.name for p in TESTS])
def test_promtool_rule_tests_pass(path: Path) -> None:
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_for_a_severity_and_what_to_do() -> None:
    found = alerts()
    assert found
    for rule in found:
        assert rule.get("for"), rule["alert"]
        labels = rule["labels"]
        assert isinstance(labels, dict), rule["alert"]
        assert labels.get("severity") in SEVERITIES, rule["alert"]
        annotations = rule["annotations"]
        assert isinstance(annotations, dict), rule["alert"]
        assert set(annotations) >= ANNOTATIONS, rule["alert"]


def test_every_alert_is_tested_firing() -> None:
    fired: set[str] = set()
    for path in TESTS:
        for test in yaml.safe_load(path.read_text("utf-8"))["tests"]:
            for case in test.get("alert_rule_test", []):
                if case["exp_alerts"]:
                    fired.add(case["alertname"])
    assert {str(rule["alert"]) for rule in alerts()} <= fired

"""Scenario files: strict validation with errors naming file and field; exit 2 on a bad file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from chaos.cli import EXIT_BAD_SCENARIO
from chaos.scenario import ScenarioError, load_scenario
from gtm.topology import load_topology
from gtmctl.cli import cli

SCENARIOS = Path(__file__).resolve().parents[4] / "chaos" / "scenarios"

GOOD: dict[str, Any] = {
    "title": "t",
    "deployment": {"topology": "topologies/small.yaml"},
    "load": {"duration_s": 20, "streams": [{"label": "eu", "api_key": "k"}]},
    "hypothesis": [
        {"probe": "success_rate", "window": "before", "min": 0.99},
        {"probe": "failover_time", "step": "kill", "max_s": 3},
    ],
    "method": [
        {
            "id": "kill",
            "at_s": 5,
            "duration_s": 5,
            "fault": {"kind": "kill", "tier": "regional/eu-west"},
        }
    ],
}


def _write(tmp_path: Path, data: object) -> Path:
    (tmp_path / "topologies").mkdir(exist_ok=True)
    (tmp_path / "topologies" / "small.yaml").write_text("regions: []\n")
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data), "utf-8")
    return path


def _with(**changes: object) -> dict[str, object]:
    return {**GOOD, **changes}


def test_a_good_file_loads_and_names_steps(tmp_path: Path) -> None:
    data = _with(method=[*GOOD["method"], {"at_s": 6, "fault": {"kind": "etcd-stop"}}])
    scenario, topology = load_scenario(_write(tmp_path, data))
    assert [s.id for s in scenario.steps()] == ["kill", "step-2"]
    assert topology == tmp_path / "topologies" / "small.yaml"


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (_with(extra=1), "extra", "Extra inputs are not permitted"),
        (_with(load={"duration_s": -1}), "load.duration_s", "greater than 0"),
        (_with(hypothesis=[{"probe": "nope"}]), "hypothesis[0]", "probe"),
        (
            _with(hypothesis=[{"probe": "success_rate", "min": 2}]),
            "hypothesis[0].success_rate.min",
            "less than or equal to 1",
        ),
        (_with(method=[{"at_s": 1, "fault": {"kind": "explode"}}]), "method[0].fault", "explode"),
        (
            _with(method=[{"at_s": 1, "fault": {"kind": "kill", "tier": "bogus"}}]),
            "method[0].fault.kill.tier",
            "not a tier",
        ),
        (_with(method=[{"at_s": 1}]), "method[0]", "exactly one of fault, load_factor"),
        (_with(method=[{"at_s": 1, "load_factor": 3}]), "method[0]", "needs duration_s"),
        (
            _with(method=[{"id": "kill", "at_s": 30, "fault": {"kind": "etcd-stop"}}]),
            "(top level)",
            "faults must happen under load",
        ),
        (_with(method=[]), "method", "at least 1 item"),
        (
            _with(hypothesis=[{"probe": "success_rate", "min": 1, "stream": "zz"}]),
            "(top level)",
            "names stream 'zz'",
        ),
        (
            _with(hypothesis=[{"probe": "failover_time", "step": "zz", "max_s": 1}]),
            "(top level)",
            "names step 'zz'",
        ),
        (
            _with(
                hypothesis=[{"probe": "refusal_codes", "allowed_statuses": [429], "cut_by": ["zz"]}]
            ),
            "(top level)",
            "refusal_codes names step 'zz'",
        ),
    ],
)
def test_bad_files_name_the_file_and_the_field(
    tmp_path: Path, data: object, field: str, message: str
) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    text = str(caught.value)
    assert str(path) in text
    assert f"  {field}" in text
    assert message in text


def test_not_yaml_not_a_mapping_missing_topology_and_unsafe_tags(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    for content, message in [
        ("title: [unclosed", "not valid YAML"),
        ("- a list\n", "expected a mapping"),
        ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ]:
        path.write_text(content)
        with pytest.raises(ScenarioError, match=message):
            load_scenario(path)
    path.write_text(yaml.safe_dump(_with(deployment={"topology": "missing.yaml"})))
    with pytest.raises(ScenarioError, match=r"deployment\.topology: no file"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")


def test_cli_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, _with(load={"duration_s": "soon"}))
    result = CliRunner().invoke(cli, ["chaos", "run", str(path)])
    assert result.exit_code == EXIT_BAD_SCENARIO
    assert str(path) in result.output
    assert "load.duration_s" in result.output


def test_policy_paths_are_relative_to_the_scenario(tmp_path: Path) -> None:
    data = _with(
        method=[{"at_s": 1, "fault": {"kind": "policy-push", "paths": ["bad.yaml"]}}],
        hypothesis=[GOOD["hypothesis"][0]],
    )
    scenario, _ = load_scenario(_write(tmp_path, data))
    assert scenario.method[0].fault.paths == (tmp_path / "bad.yaml",)  # type: ignore[union-attr]


def test_load_factor_steps_become_multipliers(tmp_path: Path) -> None:
    data = _with(
        method=[{"at_s": 5, "duration_s": 5, "load_factor": 3}], hypothesis=[GOOD["hypothesis"][0]]
    )
    scenario, _ = load_scenario(_write(tmp_path, data))
    multipliers = scenario.effective_load().multipliers
    assert [(m.at_s, m.factor) for m in multipliers] == [(5, 3), (10, 1)]


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_is_valid(path: Path) -> None:
    scenario, topology = load_scenario(path)
    assert scenario.hypothesis
    assert scenario.method
    assert topology is None or topology.is_file()
    result = CliRunner().invoke(cli, ["chaos", "run", "--check", str(path)])
    assert result.exit_code == 0, result.output


def test_the_suite_has_a_fast_subset() -> None:
    fast = [p for p in SCENARIOS.glob("*.yaml") if load_scenario(p)[0].fast]
    assert 1 <= len(fast) <= 3


def test_the_pair_topology_is_the_small_one_with_a_second_gpu_in_one_zone() -> None:
    """``small-pair.yaml`` (the black-holed GPU's game day) differs from ``small.yaml``
    only in eu-central-a's H100 count: the same layout, one GPU more."""
    folder = SCENARIOS / "topologies"
    small = load_topology(folder / "small.yaml").model_dump()
    pair = load_topology(folder / "small-pair.yaml").model_dump()
    zone = next(z for r in pair["regions"] for z in r["zones"] if z["id"] == "eu-central-a")
    assert [(g["type"], g["count"]) for g in zone["gpus"]] == [("H100", 2)]
    zone["gpus"][0]["count"] = 1
    assert pair == small

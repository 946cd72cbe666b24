"""``gtm sim`` from the command line: the traces it replays."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gtmctl.cli import cli

SMALL = ["--gpus", "8", "--regions", "2", "--duration", "3", "--no-quotas"]


def test_gtm_sim_runs_on_a_synthetic_trace(tmp_path: Path) -> None:
    args = ["sim", "--trace", "synthetic", *SMALL, "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "synthetic (fitted on azure-conv, seed 0)" in (tmp_path / "sim.md").read_text()


def test_gtm_sim_refuses_a_file_for_the_synthetic_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("x\n")
    args = ["sim", "--trace", "synthetic", "--trace-path", str(trace), *SMALL]
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "drawn, not read" in result.output


def test_gtm_sim_names_the_data_folder_when_its_places_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GTM_DATA_DIR", str(tmp_path))
    args = ["sim", "--trace", "synthetic", *SMALL, "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert "cannot read client places" in result.output
    assert f"(data folder: $GTM_DATA_DIR = {tmp_path})" in result.output

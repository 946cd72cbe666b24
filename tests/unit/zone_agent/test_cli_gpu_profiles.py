"""``gtm zone --gpu-profiles`` (and ``$GTM_GPU_PROFILES``): a bad file is a usage error
naming the file, line and field, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gtmctl.cli import cli

BASE = ["zone", "--zone", "z", "--region", "r"]


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text("format: gtm.gpu-profile/v1\ngpu_type: X\nmodel: m\nprefill: 3\n")
    return path


def test_a_bad_profile_file_is_a_usage_error_naming_it(bad: Path) -> None:
    result = CliRunner().invoke(cli, [*BASE, "--gpu-profiles", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:4: prefill:" in result.output + result.stderr


def test_the_environment_names_them_too(bad: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, BASE, env={"GTM_GPU_PROFILES": f"{tmp_path}"})
    assert result.exit_code == 2
    assert f"{bad}:4: prefill:" in result.output + result.stderr


def test_a_missing_path_and_the_help() -> None:
    result = CliRunner().invoke(cli, [*BASE, "--profiles", "/nonexistent/profiles"])
    assert result.exit_code == 2
    assert "does not exist" in result.output + result.stderr
    result = CliRunner().invoke(cli, ["zone", "--help"])
    assert "--gpu-profiles" in result.output
    assert "GTM_GPU_PROFILES" in result.output

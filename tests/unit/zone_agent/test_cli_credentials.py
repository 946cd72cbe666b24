"""``gtm zone --worker-api-key-*``: bad combinations are usage errors naming the options,
and a key file that cannot be read stops the agent naming the file (never a key)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gtmctl.cli import cli

BASE = ["zone", "--zone", "z", "--region", "r", "--listen", "127.0.0.1:0"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--worker-api-key-file", "/k", "--worker-api-key-env", "K"], "not both"),
        (["--worker-api-key-env", "not a name"], "--worker-api-key-file/-env/-dir"),
        (["--worker", "http://h:1,api-key-from=sk-secret"], "expected file:PATH or env:NAME"),
    ],
)
def test_bad_key_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, [*BASE, *args])
    assert result.exit_code == 2
    output = result.output + result.stderr
    assert message in output
    assert "sk-secret" not in output


def test_an_unreadable_key_file_stops_the_agent_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.key"
    result = CliRunner().invoke(cli, [*BASE, "--worker-api-key-file", str(missing)])
    assert result.exit_code == 2
    assert f"cannot read file {missing}" in result.output + result.stderr

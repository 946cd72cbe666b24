"""deploy/systemd: every unit passes ``systemd-analyze verify`` (with its ``gtm`` path
pointed at this venv's) and the offline security review at "OK"; each starts a daemon
command that exists and parses, waits for its READY=1, and keeps no privilege but the
global tier's low ports; the example environment files name only real flags."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gtm.envvars import RULE
from gtmctl.cli import cli

SYSTEMD = Path(__file__).parents[3] / "deploy" / "systemd"
UNITS = sorted(p.name for p in SYSTEMD.glob("*.service"))
INSTALLED_GTM = "/opt/gtm/bin/gtm"
#: Which example environment file goes with which unit.
ENV_EXAMPLES = {
    "gtm-global.service": "global.env.example",
    "gtm-regional@.service": "regional.env.example",
    "gtm-zone@.service": "zone.env.example",
    "gtm-gpu-sim@.service": "gpu-sim.env.example",
}
#: systemd-analyze security's exposure, in tenths: above 2.0 is no longer "OK".
MAX_EXPOSURE = 20
HARDENING = {
    "DynamicUser": "yes",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "SystemCallFilter": "@system-service",
    "MemoryDenyWriteExecute": "yes",
    "Restart": "on-failure",
    "Type": "notify",
}


def _settings(unit: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in (SYSTEMD / unit).read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            assert key not in settings, (unit, key)
            settings[key] = value
    return settings


def _command(unit: str) -> list[str]:
    """ExecStart's arguments after the gtm executable, an instance named ``i``."""
    argv = shlex.split(_settings(unit)["ExecStart"].replace("%i", "i"))
    assert argv[0] == INSTALLED_GTM
    return argv[1:]


def _installed_copy(unit: str, directory: Path) -> Path:
    """The unit with its ``gtm`` at this venv's (what verify checks is executable)."""
    gtm = Path(sys.executable).with_name("gtm")
    assert gtm.is_file(), gtm
    copy = directory / unit
    copy.write_text((SYSTEMD / unit).read_text().replace(INSTALLED_GTM, str(gtm)))
    return copy


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_there_is_a_unit_for_each_daemon() -> None:
    assert sorted(ENV_EXAMPLES) == UNITS


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_verify_accepts_the_unit(unit: str, tmp_path: Path) -> None:
    result = _analyze("verify", str(_installed_copy(unit, tmp_path)))
    # Unknown or misspelt keys are only warned about: any output is a failure here.
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize("unit", UNITS)
def test_the_offline_security_review_rates_the_unit_ok(unit: str, tmp_path: Path) -> None:
    result = _analyze(
        "security", "--offline=yes", f"--threshold={MAX_EXPOSURE}", "--no-pager",
        str(_installed_copy(unit, tmp_path)),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert " OK " in result.stdout.splitlines()[-1]


@pytest.mark.parametrize("unit", UNITS)
def test_the_unit_is_hardened_and_restarts_with_a_limit(unit: str) -> None:
    settings = _settings(unit)
    for key, value in HARDENING.items():
        assert settings.get(key) == value, (unit, key)
    assert int(settings["StartLimitBurst"]) > 0
    assert settings["StartLimitIntervalSec"]
    if unit == "gtm-global.service":  # DNS on :53, the front door on :443
        assert settings["CapabilityBoundingSet"] == "CAP_NET_BIND_SERVICE"
        assert settings["AmbientCapabilities"] == "CAP_NET_BIND_SERVICE"
    else:
        assert settings["CapabilityBoundingSet"] == ""
        assert "AmbientCapabilities" not in settings


@pytest.mark.parametrize("unit", UNITS)
def test_the_unit_runs_a_daemon_command_that_parses(unit: str) -> None:
    args = _command(unit)
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert " ".join(RULE.split()) in " ".join(result.output.split())  # env-configurable
    assert _settings(unit)["EnvironmentFile"].startswith("/etc/gtm/")


@pytest.mark.parametrize("unit", UNITS)
def test_the_example_environment_names_only_flags_of_the_units_command(unit: str) -> None:
    args = _command(unit)
    command = cli.get_command(click.Context(cli), args[0])
    assert command is not None
    variables = {p.envvar for p in command.params if isinstance(p, click.Option) and p.envvar}
    example = (SYSTEMD / ENV_EXAMPLES[unit]).read_text().splitlines()
    named = [line.partition("=")[0] for line in example if line and not line.startswith("#")]
    assert named
    for name in named:
        assert name in variables, (unit, name)

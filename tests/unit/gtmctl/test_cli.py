import subprocess
import sys
from importlib.metadata import entry_points

from click.testing import CliRunner

from gtm import __version__, native
from gtmctl.cli import _COMMANDS, EXIT_NOT_AVAILABLE, cli

# ARCHITECTURE §9: the public interface. Every one of these must be registered.
PUBLIC_SUBCOMMANDS = {
    "up", "global", "regional", "zone", "gpu-sim", "policy", "route", "drain", "undrain",
    "audit", "chaos", "sim", "bench",
}  # fmt: skip


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output
    # The interpreter that runs the tiers (its build moves their CPU; gtm.native).
    assert f"  python {native.interpreter()}\n" in result.output


def test_help_lists_every_public_subcommand() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in PUBLIC_SUBCOMMANDS:
        assert f"  {name} " in result.output, name
    assert set(_COMMANDS) >= PUBLIC_SUBCOMMANDS


def test_unbuilt_subcommands_say_so_and_fail() -> None:
    unbuilt = [name for name, entry in _COMMANDS.items() if entry.target is None]
    for name in unbuilt:
        result = CliRunner().invoke(cli, [name, "--some-flag"])
        assert result.exit_code == EXIT_NOT_AVAILABLE, name
        assert "not available yet" in result.output


def test_built_subcommands_have_help() -> None:
    built = [name for name, entry in _COMMANDS.items() if entry.target is not None]
    assert built, "at least one subcommand is built"
    for name in built:
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage:" in result.output


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_python_dash_m_gtmctl_is_the_gtm_command() -> None:
    # How gtm up --processes, the chaos runner and the tests start a child gtm.
    child = subprocess.run(
        [sys.executable, "-m", "gtmctl", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("Usage: gtm [OPTIONS] COMMAND [ARGS]...")
    for name, entry in _COMMANDS.items():
        assert f"  {name} " in child.stdout, name
        assert entry.help in child.stdout, name


def test_the_console_script_points_at_gtmctl() -> None:
    (script,) = [s for s in entry_points(group="console_scripts") if s.name == "gtm"]
    assert script.value == "gtmctl.cli:main"

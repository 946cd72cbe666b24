"""gtm.extras: every optional module names an extra pyproject.toml has; a report without
matplotlib is written without its figure and says what to install; a command that needs
a missing optional module ends with one line naming the extra, status 2."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gtm._version import DISTRIBUTION
from gtm.errors import ConfigError, MissingExtra
from gtm.extras import EXTRA_OF, Extra, install_line, missing_extra, optional
from gtmctl import cli as gtm_cli

PYPROJECT = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_the_distribution_name_is_pyprojects() -> None:
    assert PYPROJECT["project"]["name"] == DISTRIBUTION == "gtm-traffic-manager"


def test_each_optional_module_is_brought_by_its_extra_and_is_no_runtime_dependency() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    runtime = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert {e.value for e in Extra} <= set(extras)
    for module, extra in EXTRA_OF.items():
        assert module in {_requirement_name(r) for r in extras[extra.value]}, module
        assert module not in runtime, module


def test_install_line_names_the_distribution_and_the_extra() -> None:
    assert install_line(Extra.REPORT) == "pip install 'gtm-traffic-manager[report]'"


def test_optional_returns_the_module_or_none_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert optional("matplotlib") is not None  # the test extras install it
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert optional("matplotlib") is None
    with pytest.raises(ValueError, match="not an optional dependency"):
        optional("numpy")


def test_a_missing_optional_module_becomes_a_missing_extra_error() -> None:
    missing = missing_extra(ModuleNotFoundError("no", name="matplotlib.pyplot"))
    assert isinstance(missing, MissingExtra)
    assert isinstance(missing, ConfigError)
    assert str(missing) == (
        "matplotlib is not installed (extra 'report'): pip install 'gtm-traffic-manager[report]'"
    )
    assert missing_extra(ModuleNotFoundError("no", name="numpy")) is None


@click.command("plots")
def _needs_matplotlib() -> None:
    import matplotlib  # noqa: F401


def test_the_gtm_command_names_the_extra_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(
        gtm_cli._COMMANDS, "plots", gtm_cli._Entry("Plots.", f"{__name__}:_needs_matplotlib")
    )
    result = CliRunner().invoke(gtm_cli.cli, ["plots"], prog_name="gtm")
    assert result.exit_code == 2
    assert result.output == (
        "gtm plots: matplotlib is not installed (extra 'report'): "
        "pip install 'gtm-traffic-manager[report]'\n"
    )


@click.command("broken")
def _needs_numpy() -> None:
    import numpy  # noqa: F401


def test_a_missing_runtime_module_is_not_disguised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)
    monkeypatch.setitem(
        gtm_cli._COMMANDS, "broken", gtm_cli._Entry("Broken.", f"{__name__}:_needs_numpy")
    )
    result = CliRunner().invoke(gtm_cli.cli, ["broken"], prog_name="gtm")
    assert isinstance(result.exception, ModuleNotFoundError)


def test_a_game_day_report_without_matplotlib_says_which_extra_draws_its_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaos.journal import RunStatus
    from chaos.report import write_report
    from tests.unit.chaos.runner.test_report import ENVIRONMENT, _journal, _scenario

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    scenario, journal = _scenario(), _journal()
    results = [p.measure(journal) for p in scenario.hypothesis]
    summary = write_report(
        tmp_path, scenario, "s.yaml", journal, results, RunStatus.COMPLETED, ENVIRONMENT
    ).read_text()
    assert not (tmp_path / "timeline.png").exists()
    assert "![timeline]" not in summary
    assert (
        "No timeline plot: matplotlib is not installed "
        "(pip install 'gtm-traffic-manager[report]')." in summary
    )

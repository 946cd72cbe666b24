"""What ``gtm zone`` imports: what it serves with, and nothing else — every module a
process imports stays in its memory for its whole life (bench/footprint.py measures it)."""

from __future__ import annotations

from gtm.testing.imports import COMMAND, NOT_IN_A_DAEMON, loaded, modules_after_import


def test_a_zone_agent_imports_no_simulator_chaos_plotting_other_commands_or_x509() -> None:
    modules = modules_after_import(COMMAND, "zone_agent.cli")
    assert "zone_agent.app" in modules  # the check looked at the serving process
    assert loaded(modules, NOT_IN_A_DAEMON) == []

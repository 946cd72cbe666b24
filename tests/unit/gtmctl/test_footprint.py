"""What the ``gtm`` command and ``gtm up --processes`` import (bench/footprint.py
measures what it costs): the command table loads its subcommands lazily, and the
``gtm up`` parent, which only supervises children, loads no simulator, chaos tooling,
plotting or TLS machinery it was not asked for."""

from __future__ import annotations

from gtm.testing.imports import COMMAND, loaded, modules_after_import


def test_the_gtm_command_table_imports_no_subcommand() -> None:
    # Every child of gtm up --processes starts here; `gtm --help` too.
    modules = modules_after_import(COMMAND)
    heavy = ("aiohttp", "pydantic", "numpy", "aetcd", "yaml", "prometheus_client")
    ours = ("global_lb", "regional_lb", "zone_agent", "gpusim", "fleetsim", "chaos", "policies")
    assert loaded(modules, heavy + ours + ("gtmctl.up", "gtmctl.load")) == []


def test_gtm_up_with_processes_imports_no_simulator_chaos_plotting_or_x509() -> None:
    modules = modules_after_import(COMMAND, "gtmctl.up.cli", "gtmctl.up.processes")
    never = ("fleetsim", "chaos", "matplotlib", "scipy", "gtm.testing", "gpusim")
    # The X.509 layer and the local CA only with --tls (gtm.pki, imported when it runs).
    assert loaded(modules, (*never, "cryptography.x509", "gtm.pki")) == []
    # The in-process fleet (every tier in one process) is not loaded for --processes,
    # nor the tiers' routing (numpy): the parent only names their profiles.
    assert "gtmctl.up.inprocess" not in modules
    tiers = {m for m in modules if m.split(".")[0] in ("global_lb", "regional_lb", "zone_agent")}
    assert tiers <= {
        "global_lb",
        # The zone's --dns-ns/--dns-soa-* options, checked before the children start.
        "global_lb.dns",
        "global_lb.dns.options",
        "global_lb.dns.zone_config",
        "global_lb.profile_names",
        "zone_agent",
        "zone_agent.profile_names",
    }
    assert "numpy" not in modules

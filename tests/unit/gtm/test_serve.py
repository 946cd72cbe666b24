"""Every HTTP server of the product starts and stops through gtm.serve."""

from __future__ import annotations

from pathlib import Path

PRODUCT = ("gtm", "gtmctl", "global_lb", "regional_lb", "zone_agent", "gpusim", "chaos", "fleetsim")


def test_only_gtm_serve_builds_an_aiohttp_runner() -> None:
    root = Path(__file__).resolve().parents[3]
    for package in PRODUCT:
        for module in (root / package).rglob("*.py"):
            if module == root / "gtm" / "serve.py":
                continue
            text = module.read_text()
            assert "web.AppRunner(" not in text, module
            assert "shutdown_timeout=" not in text, module

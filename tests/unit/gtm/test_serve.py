"""Every HTTP server of the product starts and stops through gtm.serve."""

from __future__ import annotations

import gc
from pathlib import Path

from gtm.serve import COLLECTOR_GEN0_THRESHOLD, settle_collector

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
            if module.name == "cli.py" and package in (
                "global_lb",
                "regional_lb",
                "zone_agent",
                "gpusim",
            ):
                assert "add_signal_handler(" not in text, module  # until_signalled


def test_start_up_objects_are_frozen_out_of_the_collectors_reach() -> None:
    kept = [object() for _ in range(10)]
    saved = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()  # the test process keeps collecting as before
        gc.set_threshold(*saved)


def test_settle_collector_raises_the_young_threshold_only() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        settle_collector()
        assert gc.get_threshold() == (COLLECTOR_GEN0_THRESHOLD, 10, 10)
        gc.set_threshold(COLLECTOR_GEN0_THRESHOLD * 2, 5, 5)
        settle_collector()  # never lowers a higher setting
        assert gc.get_threshold() == (COLLECTOR_GEN0_THRESHOLD * 2, 5, 5)
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)

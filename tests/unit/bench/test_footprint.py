"""The footprint benchmark's own logic (bench/footprint.py): which kind a process is
from its command line, and its target over the modules a process imported."""

from __future__ import annotations

from bench.footprint import Sample, kind_of, violations


def test_kind_of_reads_the_subcommand_after_gtmctl_and_its_options() -> None:
    python = ["/venv/bin/python", "-m", "gtmctl"]
    assert kind_of([*python, "--log-level", "info", "zone", "--zone", "eu-a"]) == "zone"
    assert kind_of([*python, "--log-level", "info", "gpu-sim", "--port", "0"]) == "gpu-sim"
    assert kind_of([*python, "--log-level", "info", "--log-format", "json", "zone"]) == "zone"
    assert kind_of([*python, "up", "--processes"]) == "up"
    assert kind_of([*python, "--log-level", "info", "chaos", "proxy"]) == "other"
    assert kind_of(["/usr/bin/etcd", "--name", "m1"]) == "etcd"
    assert kind_of(["/usr/bin/python3", "-c", "pass"]) == "other"


def test_a_serving_process_that_imports_the_simulator_misses_the_target() -> None:
    clean = Sample(1, "zone", 1, 1, 1, ("zone_agent", "numpy", "gtmctl", "gtmctl.cli"))
    simulator = Sample(2, "gpu-sim", 1, 1, 1, ("gpusim", "fleetsim", "fleetsim.simulator"))
    x509 = Sample(3, "global", 1, 1, 1, ("cryptography", "cryptography.x509"))
    parent = Sample(4, "up", 1, 1, 1, ("gtmctl.up", "fleetsim"))  # not a serving process
    assert violations([clean, parent]) == []
    assert violations([clean, simulator, x509, clean]) == [
        "gpu-sim (1 of 1 processes) imports fleetsim",
        "global (1 of 1 processes) imports cryptography.x509",
    ]

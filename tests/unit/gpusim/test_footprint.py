"""What ``gtm gpu-sim`` imports: an emulated GPU worker (24 of them in the example
deployment) serves its OpenAI API and registers in the store; it routes nothing, so it
loads neither numpy nor the policy machinery (documents, residency engine, audit chain)
— every module a process imports stays in its memory for its whole life
(bench/footprint.py measures it)."""

from __future__ import annotations

from gtm.testing.imports import COMMAND, NOT_IN_A_DAEMON, loaded, modules_after_import

#: Needed by the tiers, not by a worker.
NOT_IN_A_WORKER = (
    "numpy",
    # (YAML it needs: its performance profile is a YAML file, gtm/data/profiles.)
    "policies.audit",
    "policies.documents",
    "policies.loader",
    "policies.residency",
    "global_lb",
    "regional_lb",
    "zone_agent",
)


def test_a_gpu_worker_imports_only_what_it_serves_with() -> None:
    modules = modules_after_import(COMMAND, "gpusim.cli")
    assert "gpusim.server" in modules  # the check looked at the serving process
    assert loaded(modules, NOT_IN_A_DAEMON + NOT_IN_A_WORKER) == []

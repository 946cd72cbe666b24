"""``python -m gtm`` is the ``gtm`` command, as ``python -m gtmctl`` and the console
script are."""

from __future__ import annotations

import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_python_m_gtm_runs_the_gtm_command() -> None:
    as_gtm, as_gtmctl = _run("-m", "gtm", "--version"), _run("-m", "gtmctl", "--version")
    assert as_gtm.returncode == 0, as_gtm.stderr
    assert as_gtm.stdout.startswith("gtm, version ")
    assert as_gtm.stdout == as_gtmctl.stdout
    usage = _run("-m", "gtm", "--help")
    assert usage.stdout.startswith("Usage: gtm [OPTIONS] COMMAND [ARGS]...")

"""What a process loads by importing its entry modules — for the tests that pin each
process kind's import footprint, and for ``bench/footprint.py``.

A Python process keeps every module it imported for its whole life (code objects,
classes, module dictionaries: most of a gtm process's private memory), so a serving
process must not import what it does not serve with. The check runs in a fresh
interpreter: the test process itself has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: What no serving process (front door, regional LB, zone agent, GPU worker) imports:
#: the simulator, the game-day tooling, plotting, scipy, other subcommands' command
#: trees, test helpers, and the X.509 and PKI layers (loaded only when TLS is on). A
#: top-level package, or a dotted prefix for part of one.
NOT_IN_A_DAEMON = (
    "fleetsim",
    "chaos",
    "matplotlib",
    "scipy",
    "gtmctl.up",
    "gtmctl.load",
    "gtm.testing",
    "cryptography.x509",
    "gtm.pki",
)

#: The first thing every ``gtm`` child imports (``python -m gtmctl SUBCOMMAND``).
COMMAND = "gtmctl.cli"

_SCRIPT = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def modules_after_import(*names: str, timeout_s: float = 120.0) -> frozenset[str]:
    """``sys.modules`` of a fresh interpreter after importing ``names`` in order."""
    child = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *names],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )
    if child.returncode != 0:
        raise AssertionError(f"importing {', '.join(names)} failed:\n{child.stderr[-4000:]}")
    return frozenset(json.loads(child.stdout))


def loaded(modules: frozenset[str], prefixes: tuple[str, ...]) -> list[str]:
    """Which of ``prefixes`` (a package, or a dotted prefix) ``modules`` contains."""
    return sorted({p for p in prefixes for m in modules if m == p or m.startswith(p + ".")})

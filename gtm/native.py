"""Whether gtm's kernels run compiled.

The inner loops of the routing decisions and of the simulator live in ``kernels``
modules that ``setup.py`` compiles with mypyc at install time (global_lb/kernels.py
says why). An install without a C compiler runs them as Python: the same results,
slower, and the latency targets of the README are then not what the process does.
``gtm --version`` lists each kernel's state; the tiers log a warning at start when one
is not compiled, and when its source changed since it was compiled (an editable
install keeps running the old extension until ``pip install -e .`` runs again).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from enum import StrEnum
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

log = logging.getLogger(__name__)

#: Every kernel module, by name (``setup.py``'s ``KERNELS``, as modules).
KERNEL_MODULES: tuple[str, ...] = (
    "global_lb.kernels",
    "global_lb.plugins._ttft",
    "zone_agent.costs._ttft",
    "zone_agent.costs._blend",
)


class KernelState(StrEnum):
    COMPILED = "compiled"
    #: Compiled, but its ``.py`` source is newer than the extension (rebuild it).
    STALE = "stale"
    PYTHON = "python"


@dataclass(frozen=True, slots=True)
class Kernel:
    module: str
    state: KernelState
    path: str

    def describe(self) -> str:
        advice = {
            KernelState.COMPILED: "",
            KernelState.STALE: " — source changed since it was compiled: run `pip install -e .`",
            KernelState.PYTHON: " — not compiled (no C compiler at install?): routing is slower",
        }[self.state]
        return f"{self.module}: {self.state.value}{advice}"


def kernel(module_name: str) -> Kernel:
    """The state of one kernel module (imported by name; a C-only kernel that was not
    built does not import, and its callers use their numpy path)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return Kernel(module_name, KernelState.PYTHON, "")
    path = Path(module.__file__ or "")
    if not any(path.name.endswith(suffix) for suffix in EXTENSION_SUFFIXES):
        return Kernel(module_name, KernelState.PYTHON, str(path))
    stem = path.name.split(".", 1)[0]
    for source in (path.with_name(stem + ".py"), path.with_name(stem + ".c")):
        if source.exists() and source.stat().st_mtime > path.stat().st_mtime:
            return Kernel(module_name, KernelState.STALE, str(path))
    return Kernel(module_name, KernelState.COMPILED, str(path))


def kernels() -> tuple[Kernel, ...]:
    return tuple(kernel(name) for name in KERNEL_MODULES)


def warn_if_not_compiled(*module_names: str) -> None:
    """Log a warning for each of ``module_names`` (default: all) not running compiled."""
    for name in module_names or KERNEL_MODULES:
        found = kernel(name)
        if found.state is not KernelState.COMPILED:
            log.warning("kernel %s", found.describe())

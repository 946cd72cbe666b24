"""Whether gtm's kernels run compiled.

The inner loops of the routing decisions and of the simulator live in ``kernels``
modules that ``setup.py`` compiles with mypyc at install time (global_lb/kernels.py
says why). An install without a C compiler runs them as Python: the same results,
slower, and the latency targets of the README are then not what the process does.
``gtm --version`` lists each kernel's state; the tiers log a warning at start when one
is not compiled, and when its source changed since it was compiled (an editable
install keeps running the old extension until ``pip install -e .`` runs again).

Whether a source changed since its extension was built is read two ways:

* an install from a wheel lists every file it wrote, with its sha256, in the
  distribution's ``RECORD``: a kernel whose extension and source are both listed, and
  whose source still has the listed hash, came out of one build of one tree, so it is
  fresh — whatever order the installer wrote the files in (pip writes a ``.py`` after
  the extension beside it, so its modification time is the later one);
* anything else (an editable install builds the extensions in the checkout, whose
  sources the developer edits; a wheel's source edited after install) compares
  modification times: a source newer than its extension is stale.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib
import logging
import sys
from dataclasses import dataclass
from enum import StrEnum
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from gtm._version import DISTRIBUTION

log = logging.getLogger(__name__)

#: Every kernel module, by name (``setup.py``'s ``KERNELS``, as modules).
KERNEL_MODULES: tuple[str, ...] = (
    "global_lb.kernels",
    "global_lb.plugins._ttft",
    "zone_agent.costs._ttft",
    "zone_agent.costs._blend",
    "zone_agent._prefix",
    "gtm.routing._placement",
    "gtm._tokens",
    "gtm._logline",
    "zone_agent._exposition",
)


class KernelState(StrEnum):
    COMPILED = "compiled"
    #: Compiled, but its source changed since (rebuild it).
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
            KernelState.STALE: " — source changed since it was compiled: run `pip install -e .`"
            " (or reinstall the wheel)",
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
    return Kernel(module_name, extension_state(path, module_name), str(path))


def extension_state(extension: Path, module_name: str) -> KernelState:
    """:attr:`~KernelState.COMPILED` or :attr:`~KernelState.STALE` for the extension
    module ``module_name`` at ``extension`` (the module's docstring says how)."""
    stem = extension.name.split(".", 1)[0]
    sources = [
        source
        for source in (extension.with_name(stem + ".py"), extension.with_name(stem + ".c"))
        if source.exists()
    ]
    root = extension.parents[module_name.count(".")]
    shipped = _installed_files(root)
    if sources and _relative(extension, root) in shipped:
        changed = [s for s in sources if shipped.get(_relative(s, root)) != _sha256(s)]
        return KernelState.STALE if changed else KernelState.COMPILED
    built = extension.stat().st_mtime
    if any(source.stat().st_mtime > built for source in sources):
        return KernelState.STALE
    return KernelState.COMPILED


def _installed_files(root: Path) -> dict[str, str]:
    """Path (relative to ``root``, ``/``-separated) → its ``RECORD`` hash, for every
    file the wheel install of gtm in ``root`` wrote; empty when gtm in ``root`` is no
    wheel install (an editable install's ``RECORD`` lists no sources either)."""
    normalized = DISTRIBUTION.replace("-", "_")
    files: dict[str, str] = {}
    for record in root.glob(f"{normalized}-*.dist-info/RECORD"):
        with record.open(encoding="utf-8", newline="") as lines:
            for row in csv.reader(lines):
                if len(row) >= 2 and row[1]:
                    files[row[0]] = row[1]
    return files


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _sha256(path: Path) -> str:
    """A file's hash as ``RECORD`` writes it (PEP 376/427: urlsafe base64, no padding)."""
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def interpreter(maps: Path = Path("/proc/self/maps")) -> str:
    """The Python running this process, for ``gtm --version`` and benchmark reports: its
    version, executable and how its core is linked. A core loaded as a shared library
    (``libpython3.x.so``, as pyenv's default build) costs the interpreter's every call
    an indirection that a statically linked one (Debian's ``/usr/bin/python3``, the
    image's) does not: the zone agent's CPU per request differs by about a tenth
    (CHANGELOG), so a figure is read with the interpreter that made it. ``maps``: where
    the process's mappings are read (Linux); elsewhere the link is not told."""
    version = ".".join(map(str, sys.version_info[:3]))
    described = f"{sys.implementation.name} {version} at {Path(sys.executable).resolve()}"
    try:
        mapped = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return described
    shared = sorted({line.split()[-1] for line in mapped.splitlines() if "/libpython" in line})
    if shared:
        return f"{described} (core from {shared[0]})"
    return f"{described} (core linked in)"


def kernels() -> tuple[Kernel, ...]:
    return tuple(kernel(name) for name in KERNEL_MODULES)


def warn_if_not_compiled(*module_names: str) -> None:
    """Log a warning for each of ``module_names`` (default: all) not running compiled."""
    for name in module_names or KERNEL_MODULES:
        found = kernel(name)
        if found.state is not KernelState.COMPILED:
            log.warning("kernel %s", found.describe())

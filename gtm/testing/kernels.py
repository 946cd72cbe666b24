"""The Python twin of a compiled kernel module, for tests that run both.

``setup.py`` compiles each ``kernels`` module with mypyc; the import system then loads
the extension and never the ``.py`` beside it. :func:`python_twin` executes that source
as a module of its own, so a test can check the two give the same results (the
contract a compiled kernel must keep: an install without a compiler runs the twin).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from gtm.native import KernelState


def source_of(module_name: str) -> Path:
    """The ``.py`` source of a (possibly compiled) module in this checkout."""
    module = importlib.import_module(module_name)
    path = Path(module.__file__ or "")
    return path.with_name(path.name.split(".", 1)[0] + ".py")


def python_twin(module_name: str) -> ModuleType:
    """``module_name``'s source run as plain Python, under ``<name>_python``."""
    twin_name = f"{module_name}_python"
    found = sys.modules.get(twin_name)
    if found is not None:
        return found
    spec = importlib.util.spec_from_file_location(twin_name, source_of(module_name))
    assert spec is not None
    assert spec.loader is not None
    twin = importlib.util.module_from_spec(spec)
    sys.modules[twin_name] = twin
    spec.loader.exec_module(twin)
    return twin


def expected_state() -> KernelState:
    """How the kernels must run here: compiled, unless ``GTM_PURE_PYTHON`` asked for an
    install without them (CI never does: a silent fallback must fail it)."""
    return KernelState.PYTHON if os.environ.get("GTM_PURE_PYTHON") else KernelState.COMPILED

"""Builds gtm's compiled kernels; everything else is configured in pyproject.toml.

The modules in ``KERNELS`` are plain, typed Python that mypyc (the compiler shipped with
mypy) turns into C extensions at install time: the inner loops of the routing decisions;
``C_KERNELS`` are small C files over numpy arrays. Each is optional: without a C
compiler, or with ``GTM_PURE_PYTHON=1`` in the environment, the install goes on and the
same code runs as Python (a C kernel's caller then uses numpy), with the same results,
slower (``gtm --version`` says which).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNELS = ["global_lb/kernels.py"]
#: Hand-written C over numpy arrays (mypyc cannot read them without a call per item).
C_KERNELS = [Extension("zone_agent._blend", ["zone_agent/_blend.c"], optional=True)]


class OptionalBuildExt(build_ext):
    """A kernel that fails to compile is left as Python, with a warning, not an error."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            print(f"gtm: kernels not compiled, running as Python ({exc})", file=sys.stderr)

    def build_extension(self, ext):  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"gtm: {ext.name} not compiled, running as Python ({exc})", file=sys.stderr)


def ext_modules() -> list[object]:
    if os.environ.get("GTM_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("gtm: mypyc not found, kernels run as Python", file=sys.stderr)
        return list(C_KERNELS)
    # Not the project's mypy configuration: its pydantic plugin is not in the build
    # environment, and the kernels import nothing that needs it.
    return [*mypycify(["--config-file=", *KERNELS], opt_level="3"), *C_KERNELS]


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})

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

#: The hash table both allocated-whole structures share (one home, both include it).
OPEN_ADDRESSING = "gtm/routing/_open_addressing.h"
KERNELS = ["global_lb/kernels.py", "global_lb/plugins/_ttft.py"]
#: Hand-written C over numpy arrays (mypyc cannot read them without a call per item).
#: No contraction of a * b + c into a fused multiply-add: the kernels repeat numpy's
#: operations one IEEE rounding at a time, to give the same floats.
C_KERNELS = [
    Extension(
        f"zone_agent.costs._{name}",
        [f"zone_agent/costs/_{name}.c"],
        depends=["zone_agent/costs/_buffers.h"],
        optional=True,
        extra_compile_args=["-ffp-contract=off"],
    )
    for name in ("ttft", "blend")
] + [
    # The zone agent's prefix index, allocated whole (zone_agent/prefix.py says why).
    Extension(
        "zone_agent._prefix",
        ["zone_agent/_prefix.c"],
        depends=[OPEN_ADDRESSING],
        include_dirs=["."],
        optional=True,
    ),
    # Every prompt's token count, one pass without an object per piece (gtm/tokens.py).
    Extension("gtm._tokens", ["gtm/_tokens.c"], optional=True),
    # A text log line's fields, one call per line (the access log's; gtm/logs.py).
    Extension("gtm._logline", ["gtm/_logline.c"], optional=True),
    # The lines of a worker's /metrics the zone agent reads (zone_agent/exposition.py).
    Extension("zone_agent._exposition", ["zone_agent/_exposition.c"], optional=True),
    # The tiers' placement memory, allocated whole (gtm/routing/placement.py says why).
    Extension(
        "gtm.routing._placement",
        ["gtm/routing/_placement.c"],
        depends=[OPEN_ADDRESSING],
        include_dirs=["."],
        optional=True,
    ),
]


def ext_modules() -> list[object]:
    if os.environ.get("GTM_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("gtm: mypyc not found, kernels run as Python", file=sys.stderr)
        return list(C_KERNELS)
    # Not the project's mypy configuration: its pydantic plugin is not in the build
    # environment, and the kernels import nothing that needs it. Imports are not
    # followed: a kernel's package (global_lb.plugins) imports the rest of gtm, which
    # the kernel itself never reads.
    compiled = mypycify(["--config-file=", "--follow-imports=skip", *KERNELS], opt_level="3")
    for extension in compiled:
        # setuptools' own rule for optional extensions: one that fails to compile is
        # left out with a warning, and the install goes on.
        extension.optional = True
    return [*compiled, *C_KERNELS]


setup(ext_modules=ext_modules())

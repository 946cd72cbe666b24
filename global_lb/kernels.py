"""The global tier's RTT loop over regions, compiled to C by mypyc when gtm is installed.

A cold region decision spends much of its time in two loops: the RTTs from a client seen
for the first time to every region (great-circle distances, here), and the fused TTFT +
load total of every survivor (:mod:`global_lb.plugins._ttft`, beside the formula
it compiles). In CPython each iteration is interpreter work around a few floating-point
operations; mypyc (the compiler mypy ships, https://mypyc.readthedocs.io) turns these
typed functions into C with unboxed floats (bench/global_decision.py prints the effect;
``gtm.native`` says whether this module is compiled).

This file is the only source: ``setup.py`` compiles it at install time, and without a C
compiler it runs as plain Python with the same results (tests/unit/global_lb/
test_kernels.py runs both on the same inputs). Only what mypyc compiles well belongs
here: module-level functions over floats, ints, tuples and lists, no classes, nothing
from the rest of gtm.
"""

from __future__ import annotations

from math import asin, sqrt


def fill_chord_rtts(
    row: list[float],
    xs: tuple[float, ...],
    ys: tuple[float, ...],
    zs: tuple[float, ...],
    here: tuple[float, float, float],
    positions: tuple[int, ...],
    intercept_ms: float,
    ms_per_radian: float,
) -> None:
    """``row[i]`` = the distance-fit RTT from the unit vector ``here`` to region ``i``
    (unit vector ``(xs[i], ys[i], zs[i])``), for each ``i`` in ``positions``.

    The central angle is ``2·asin(chord / 2)``: the haversine formula in chord form,
    exact for unit vectors and one square root per region; ``min(1, ·)`` guards the
    rounding of antipodal points. ``ms_per_radian`` carries the factor 2 and the radius.
    """
    x, y, z = here
    for i in positions:
        dx = xs[i] - x
        dy = ys[i] - y
        dz = zs[i] - z
        half_chord = 0.5 * sqrt(dx * dx + dy * dy + dz * dz)
        row[i] = intercept_ms + ms_per_radian * asin(half_chord if half_chord < 1.0 else 1.0)

"""The global tier's inner loops over regions, compiled to C by mypyc when gtm is installed.

A cold region decision over 50 regions spends most of its time in two loops: the RTTs
from a client seen for the first time to every region (great-circle distances), and the
fused TTFT + load score of every survivor. In CPython each iteration costs a few
hundred nanoseconds of interpreter work around a few floating-point operations; mypyc
(the compiler mypy ships, https://mypyc.readthedocs.io) turns these typed functions
into C with unboxed floats, 4-5x faster (bench/global_decision.py prints the effect;
``gtm.native`` says whether this module is compiled).

This file is the only source: ``setup.py`` compiles it at install time, and without a C
compiler it runs as plain Python with the same results (tests/unit/global_lb/
test_kernels.py runs both on the same inputs). Only what mypyc compiles well belongs
here: module-level functions over floats, ints, tuples and lists, no classes, nothing
from the rest of gtm.
"""

from __future__ import annotations

from math import asin, exp, sqrt


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


def ttft_load_totals(
    fixed: tuple[float, ...],
    headroom: tuple[float, ...],
    shift: float,
    best: float,
    ttft_weight: float,
    load_weight: float,
    weight_sum: float,
    scale_ms: float,
) -> tuple[list[float], int]:
    """Each survivor's ``(w_ttft·exp((best − cost) / scale) + w_load·headroom) / Σw``
    with ``cost = fixed + shift``, and the index of the first highest total.

    The same expression, in the same floating-point order, as the ``ttft-scorer`` then
    ``load-scorer`` profile (global_lb/pipeline.py explains why ``best − cost`` is the
    scorer's ``−(cost − best)``). The first highest is what ``totals.index(max(totals))``
    finds: a later total replaces it only when strictly greater.
    """
    totals: list[float] = []
    top = 0
    top_total = 0.0
    for i in range(len(fixed)):
        total = (
            ttft_weight * exp((best - (fixed[i] + shift)) / scale_ms) + load_weight * headroom[i]
        ) / weight_sum
        totals.append(total)
        if i == 0 or total > top_total:
            top, top_total = i, total
    return totals, top


def load_totals(
    headroom: tuple[float, ...], ttft_weight: float, load_weight: float, weight_sum: float
) -> tuple[list[float], int]:
    """:func:`ttft_load_totals` when no cost is finite (every TTFT score is 0)."""
    totals: list[float] = []
    top = 0
    top_total = 0.0
    for i in range(len(headroom)):
        total = (ttft_weight * 0.0 + load_weight * headroom[i]) / weight_sum
        totals.append(total)
        if i == 0 or total > top_total:
            top, top_total = i, total
    return totals, top


def shifted_costs(
    fixed: tuple[float, ...], per_token: tuple[float, ...], tokens: int
) -> tuple[float, ...]:
    """``fixed[i] + tokens × per_token[i]``: each survivor's TTFT cost (``tokens`` is
    converted to a float once, as Python does for each ``int × float``)."""
    n = float(tokens)
    return tuple([fixed[i] + n * per_token[i] for i in range(len(fixed))])

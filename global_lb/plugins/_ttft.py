"""The compiled form of the global TTFT + load total (:mod:`global_lb.plugins.ttft` holds
the formula in all its forms and says what each one is for).

``setup.py`` compiles this file with mypyc (the compiler mypy ships) at install time:
typed loops over floats become C with unboxed floats. Without a C compiler it runs as
plain Python with the same results; tests/unit/global_lb/plugins/test_ttft.py runs the
compiled module, its Python twin and the scalar reference on the same inputs and
requires the same bits. Only what mypyc compiles well belongs here: module-level
functions over floats, ints, tuples and lists, nothing from the rest of gtm.
"""

from __future__ import annotations

from math import exp


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
    with ``cost = fixed + shift``, and the index of the first highest total (a later
    total replaces it only when strictly greater: ``totals.index(max(totals))``)."""
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

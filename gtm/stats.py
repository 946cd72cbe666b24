"""Percentiles: the one definition every report, benchmark and admin endpoint uses.

**Nearest rank.** The q-percentile of n values is the value of rank ⌈q·n⌉ (1-based, at
least 1) in ascending order — numpy's ``method="inverted_cdf"``. It is chosen over linear
interpolation (numpy's default) because:

* it is a value some request really saw, so a p99 never reports a latency that did not
  happen, and a p50 of integers is an integer;
* it is defined when samples are infinite: the simulator counts a request that never got
  a first token as infinitely late, and linear interpolation between two infinities (or
  at a fraction of 0 next to one) is NaN, while the nearest rank is simply ``inf``;
* it is what ``gtm load`` has always printed, so live and simulated figures compare.

numpy-based code that needs the same figure passes ``method="inverted_cdf"``.

``q`` is a fraction in [0, 1] (0.99 for p99), read as the decimal it is written as
(``0.07 × 100`` is rank 7, not the 8 that binary floating point would round it to). A
``q`` outside [0, 1] raises ``ValueError`` — a p99 asked for as ``99`` is a bug, not the
maximum. No values have no percentile: the answer is NaN, which prints as ``nan`` and
compares false with every bound, where 0 would read as a perfect latency.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

__all__ = ["percentile", "percentile_of_sorted", "rank"]


def rank(count: int, q: float) -> int:
    """0-based index of the nearest-rank ``q``-percentile among ``count`` ascending values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile fraction must be in [0, 1], got {q!r}")
    if count <= 0:
        raise ValueError(f"no values to rank (count {count})")
    return max(1, math.ceil(Fraction(repr(float(q))) * count)) - 1


def percentile_of_sorted(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-percentile of values already in ascending order (NaN if none)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile fraction must be in [0, 1], got {q!r}")
    if len(ordered) == 0:
        return math.nan
    return float(ordered[rank(len(ordered), q)])


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank ``q``-percentile of ``values``, in any order (NaN if none)."""
    return percentile_of_sorted(sorted(values), q)

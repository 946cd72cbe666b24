"""Reductions for small arrays on the decision path.

``ndarray.min()``/``.max()``/``.any()`` go through numpy's Python-level ``_methods``
wrappers; ``argmin``/``argmax`` are C methods and skip them. On the small arrays of a
zone that wrapper is most of a reduction's cost, and a decision makes a dozen
reductions, so these go through the C methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def fmin(values: npt.NDArray[np.float64]) -> float:
    """The smallest value (NaN if any value is NaN). ``values`` must not be empty."""
    return float(values[values.argmin()])


def fmax(values: npt.NDArray[Any]) -> float:
    """The largest value (NaN if any value is NaN). ``values`` must not be empty."""
    return float(values[values.argmax()])


def fany(mask: npt.NDArray[np.bool_]) -> bool:
    """Whether any element is true (argmax of a boolean array finds the first True)."""
    return len(mask) > 0 and bool(mask[mask.argmax()])


def fall(mask: npt.NDArray[np.bool_]) -> bool:
    """Whether every element is true."""
    return len(mask) == 0 or bool(mask[mask.argmin()])

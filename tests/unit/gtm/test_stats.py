import math
import random

import numpy as np
import pytest

from gtm.stats import percentile, percentile_of_sorted, rank

SIZES = [1, 2, 3, 7, 10, 99, 100, 101, 1000, 1001]
FRACTIONS = [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0]


def _samples(size: int) -> list[float]:
    rng = random.Random(size)
    # Duplicates on purpose: ties must not move the rank.
    return [float(rng.randrange(size // 2 + 1)) + rng.random() * (size % 3) for _ in range(size)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("q", FRACTIONS)
def test_percentile_is_numpys_inverted_cdf(size: int, q: float) -> None:
    values = _samples(size)
    expected = float(np.quantile(np.array(values), q, method="inverted_cdf"))
    assert percentile(values, q) == expected


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([3.0, 1.0, 2.0], 0.5, 2.0),  # order of the input does not matter
        ([float(i) for i in range(1, 101)], 0.99, 99.0),  # rank ⌈0.99 × 100⌉ = 99, not the max
        ([float(i) for i in range(1, 101)], 1.0, 100.0),
        ([float(i) for i in range(1, 101)], 0.0, 1.0),
        ([5.0], 0.99, 5.0),
        ([1.0, 2.0], 0.5, 1.0),  # a value seen, not the 1.5 between them
        ([float(i) for i in range(1, 101)], 0.07, 7.0),  # 0.07 read as written
    ],
)
def test_percentile_table(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


def test_a_numpy_fraction_reads_as_its_float() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, np.float64(0.99)) == 99.0


def test_infinite_samples_give_a_value_not_nan() -> None:
    # The simulator counts a request with no first token as infinitely late; linear
    # interpolation turns two neighbouring infinities into NaN.
    values = [1.0, 2.0, math.inf, math.inf]
    assert percentile(values, 0.5) == 2.0
    assert percentile(values, 0.99) == math.inf
    with np.errstate(invalid="ignore"):
        assert math.isnan(float(np.percentile(values, 99)))


def test_no_values_have_no_percentile() -> None:
    assert math.isnan(percentile([], 0.99))
    assert math.isnan(percentile_of_sorted([], 0.5))


@pytest.mark.parametrize("q", [-0.01, 1.01, 99.0, math.nan])
def test_a_fraction_outside_0_1_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0], q)
    with pytest.raises(ValueError, match="fraction"):
        percentile_of_sorted([], q)


def test_rank_is_the_index_percentile_reads() -> None:
    ordered = sorted(_samples(1000))
    assert rank(1000, 0.99) == 989
    assert percentile_of_sorted(ordered, 0.99) == ordered[rank(1000, 0.99)]
    with pytest.raises(ValueError, match="no values"):
        rank(0, 0.5)

"""The admission rule (zone_agent.costs.admission): the numpy form admits exactly as the
scalar reference, NaN and infinities included, and the TPOT slack's formula."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from zone_agent.costs.admission import (
    admitted_numpy,
    admitted_reference,
    decode_context_tokens,
    tpot_slack_ms,
)

_VALUE = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([math.inf, -math.inf, math.nan, 0.0]),
)


@given(
    st.integers(min_value=1, max_value=12).flatmap(
        lambda n: st.tuples(*(st.lists(_VALUE, min_size=n, max_size=n) for _ in range(3)))
    ),
    st.floats(min_value=0.0, max_value=1e5, allow_nan=False),
)
def test_numpy_form_admits_as_the_reference(
    columns: tuple[list[float], list[float], list[float]], budget: float
) -> None:
    queue, prefill, slack = (np.array(c, dtype=np.float64) for c in columns)
    assert admitted_numpy(queue, prefill, slack, budget).tolist() == admitted_reference(
        queue, prefill, slack, budget
    )


def test_a_gpu_is_admitted_within_its_queue_budget_and_its_decoders_slack() -> None:
    queue = np.array([100.0, 900.0, 100.0, math.nan, 100.0])
    prefill = np.array([50.0, 50.0, 500.0, 50.0, 50.0])
    slack = np.array([math.inf, math.inf, 400.0, math.inf, 50.0])
    assert admitted_reference(queue, prefill, slack, 500.0) == [True, False, False, False, True]


def test_tpot_slack_is_the_decode_s_room_under_the_bound() -> None:
    # 11 tokens at 20 ms a step within 100 ms a token: 10 gaps of 80 ms each.
    assert tpot_slack_ms(100.0, 20.0, 11) == 800.0
    assert tpot_slack_ms(100.0, 120.0, 11) < 0  # that GPU cannot meet it at all
    assert tpot_slack_ms(100.0, 20.0, 1) == math.inf  # one token: no TPOT


def test_decode_context_is_the_prompt_and_half_the_answer() -> None:
    assert decode_context_tokens(1000, 100) == 1050.0
    assert decode_context_tokens(1000, -5) == 1000.0

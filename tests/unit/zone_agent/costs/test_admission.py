"""The admission rule (zone_agent.costs.admission): the numpy form admits exactly as the
scalar reference, NaN and infinities included; the one-GPU check never admits where the
rule would not, and admits wherever the request is on time and admitted; the TPOT
slack's formula."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from zone_agent.costs.admission import (
    admitted_alone,
    admitted_numpy,
    admitted_reference,
    decode_context_tokens,
    on_time_numpy,
    on_time_reference,
    tpot_slack_ms,
)

_VALUE = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([math.inf, -math.inf, math.nan, 0.0]),
)


@given(
    st.integers(min_value=1, max_value=12).flatmap(
        lambda n: st.tuples(
            *(st.lists(_VALUE, min_size=n, max_size=n) for _ in range(5)),
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    ),
    st.floats(min_value=0.0, max_value=1e5, allow_nan=False),
    st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    st.floats(min_value=0.0, max_value=1e3, allow_nan=False),
)
def test_numpy_forms_admit_as_the_references(
    columns: tuple[list[float], list[float], list[float], list[float], list[float], list[bool]],
    budget: float,
    ttft_slo: float,
    tpot_slo: float,
) -> None:
    queue, prefill, slack, ttft, step = (np.array(c, dtype=np.float64) for c in columns[:5])
    on_time = np.array(columns[5], dtype=np.bool_)
    assert admitted_numpy(queue, prefill, slack, on_time, budget).tolist() == (
        admitted_reference(queue, prefill, slack, on_time, budget)
    )
    assert on_time_numpy(ttft, step, ttft_slo, tpot_slo).tolist() == (
        on_time_reference(ttft, step, ttft_slo, tpot_slo)
    )


@given(
    st.integers(min_value=1, max_value=12).flatmap(
        lambda n: st.tuples(
            *(st.lists(_VALUE, min_size=n, max_size=n) for _ in range(5)),
            st.integers(min_value=0, max_value=n - 1),
        )
    ),
    st.floats(min_value=0.0, max_value=1e5, allow_nan=False),
    st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    st.floats(min_value=0.0, max_value=1e3, allow_nan=False),
)
def test_the_one_gpu_check_agrees_with_the_whole_rule(
    columns: tuple[list[float], list[float], list[float], list[float], list[float], int],
    budget: float,
    ttft_slo: float,
    tpot_slo: float,
) -> None:
    queue, prefill, slack, ttft, step = (np.array(c, dtype=np.float64) for c in columns[:5])
    g = columns[5]
    on_time = on_time_reference(ttft, step, ttft_slo, tpot_slo)
    rule = admitted_reference(queue, prefill, slack, np.array(on_time), budget)
    alone = admitted_alone(
        float(queue[g]),
        float(prefill[g]),
        float(slack[g]),
        float(ttft[g]),
        float(step[g]),
        budget,
        ttft_slo,
        tpot_slo,
    )
    # Never admits where the rule does not; where the request is on time, it is the rule.
    assert not alone or rule[g]
    if on_time[g]:
        assert alone == rule[g]


def test_a_gpu_is_admitted_within_its_queue_budget_and_its_decoders_slack() -> None:
    queue = np.array([100.0, 900.0, 100.0, math.nan, 100.0])
    prefill = np.array([50.0, 50.0, 500.0, 50.0, 50.0])
    slack = np.array([math.inf, math.inf, 400.0, math.inf, 50.0])
    anywhere = np.ones(5, dtype=np.bool_)
    assert admitted_reference(queue, prefill, slack, anywhere, 500.0) == [
        True,
        False,
        False,
        False,
        True,
    ]


def test_a_request_on_time_somewhere_is_not_sent_where_it_is_lost() -> None:
    queue = np.array([900.0, 100.0, 100.0])  # the on-time GPU has a deep queue now
    prefill = slack = np.zeros(3)
    on_time = np.array([True, False, False])
    assert admitted_reference(queue, prefill, slack, on_time, 500.0) == [False] * 3
    # On time nowhere (a long prompt): wherever it fits.
    nowhere = np.zeros(3, dtype=np.bool_)
    assert admitted_reference(queue, prefill, slack, nowhere, 500.0) == [False, True, True]


def test_on_time_needs_the_ttft_within_and_the_decode_step_under_the_bounds() -> None:
    ttft = np.array([1_000.0, 3_000.0, 1_000.0, math.nan])
    step = np.array([20.0, 20.0, 120.0, 20.0])
    assert on_time_reference(ttft, step, 2_000.0, 100.0) == [True, False, False, False]


def test_tpot_slack_is_the_decode_s_room_under_the_bound() -> None:
    # 11 tokens at 20 ms a step within 100 ms a token: 10 gaps of 80 ms each.
    assert tpot_slack_ms(100.0, 20.0, 11) == 800.0
    assert tpot_slack_ms(100.0, 120.0, 11) < 0  # that GPU cannot meet it at all
    assert tpot_slack_ms(100.0, 20.0, 1) == math.inf  # one token: no TPOT


def test_decode_context_is_the_prompt_and_half_the_answer() -> None:
    assert decode_context_tokens(1000, 100) == 1050.0
    assert decode_context_tokens(1000, -5) == 1000.0

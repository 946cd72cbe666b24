"""The synthetic trace: its fit is the vendored trace's, its draws follow the fit, one
seed gives one trace."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics

import pytest

from fleetsim.synthetic import AZURE_CONV_FIT, SyntheticFit, fit, synthetic_trace
from fleetsim.traces import TraceKind, load_trace


def test_the_stored_fit_is_a_refit_of_the_azure_conversation_trace() -> None:
    refit = fit(load_trace(TraceKind.AZURE_CONV))
    assert refit.source == AZURE_CONV_FIT.source
    for name in ("input_min", "input_max", "output_min", "output_max"):
        assert getattr(refit, name) == getattr(AZURE_CONV_FIT, name), name
    for name in (
        "span_s", "rate_per_s", "gap_shape", "input_log_mean", "input_log_sd",
        "output_log_mean", "output_log_sd",
    ):  # fmt: skip
        assert getattr(refit, name) == pytest.approx(getattr(AZURE_CONV_FIT, name), rel=1e-3)


def test_one_seed_gives_one_trace() -> None:
    first = synthetic_trace(seed=7)
    assert first.requests == synthetic_trace(seed=7).requests
    assert first.requests != synthetic_trace(seed=8).requests
    assert first.kind is TraceKind.SYNTHETIC
    assert first.requests[0].at_s == 0.0
    assert all(r.prefix_hashes == () for r in first.requests)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_draws_follow_the_fit(seed: int) -> None:
    trace = synthetic_trace(seed=seed)
    drawn = fit(trace)
    # ~19,000 draws: the standard error of a log mean is sd/√n ≈ 0.007.
    assert drawn.input_log_mean == pytest.approx(AZURE_CONV_FIT.input_log_mean, abs=0.03)
    assert drawn.input_log_sd == pytest.approx(AZURE_CONV_FIT.input_log_sd, abs=0.03)
    assert drawn.output_log_mean == pytest.approx(AZURE_CONV_FIT.output_log_mean, abs=0.03)
    assert drawn.output_log_sd == pytest.approx(AZURE_CONV_FIT.output_log_sd, abs=0.03)
    assert drawn.rate_per_s == pytest.approx(AZURE_CONV_FIT.rate_per_s, rel=0.03)
    assert drawn.gap_shape == pytest.approx(AZURE_CONV_FIT.gap_shape, rel=0.1)
    assert trace.duration_s <= AZURE_CONV_FIT.span_s
    assert all(
        AZURE_CONV_FIT.input_min <= r.input_tokens <= AZURE_CONV_FIT.input_max
        and AZURE_CONV_FIT.output_min <= r.output_tokens <= AZURE_CONV_FIT.output_max
        for r in trace.requests
    )


def test_a_poisson_model_draws_exponential_gaps() -> None:
    model = dataclasses.replace(AZURE_CONV_FIT, gap_shape=1.0, rate_per_s=20.0, span_s=2000.0)
    trace = synthetic_trace(model, seed=2)
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(trace.requests)]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1.0, abs=0.03)
    assert len(trace.requests) == pytest.approx(40_000, rel=0.03)


def test_the_fit_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AZURE_CONV_FIT.rate_per_s = 1.0  # type: ignore[misc]
    assert isinstance(AZURE_CONV_FIT, SyntheticFit)
    assert math.isfinite(AZURE_CONV_FIT.gap_shape)

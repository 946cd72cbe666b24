"""The ``synthetic`` trace: arrivals and sizes drawn from a model fitted on a real trace.

For a run without any trace file (``gtm load --trace synthetic``, ``gtm sim --trace
synthetic``, a game day's ``trace: synthetic``). The model is the simplest one that keeps
what routing is sensitive to:

* **Arrivals**: a renewal process with gamma-distributed gaps at the trace's mean rate;
  the shape ``1 / CV²`` of the measured gaps keeps the trace's burstiness (shape 1 would
  be Poisson; below 1, burstier).
* **Sizes**: prompt and output token counts each lognormal (the mean and standard
  deviation of their logarithms), clipped to the range the trace shows. Prompt and output
  sizes are drawn independently: their logarithms are nearly uncorrelated in the source.

No prefix sharing is modelled (every prompt is unique), so prefix-cache affinity has
nothing to find: use the Mooncake trace for that.

:data:`AZURE_CONV_FIT` holds the fitted numbers; ``tests/unit/fleetsim/test_synthetic.py``
refits them from the vendored trace (:func:`fit`), so the constant cannot drift from its
source. The draw uses :class:`random.Random`, so one seed gives one trace everywhere.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass

from fleetsim.traces import Trace, TraceKind, TraceRequest


@dataclass(frozen=True, slots=True)
class SyntheticFit:
    """A fitted trace model (see the module docstring); sizes in tokens."""

    #: The trace the numbers were fitted on.
    source: str
    #: Its span: a synthetic trace is drawn over as much time, as its source covers.
    span_s: float
    rate_per_s: float
    #: Gamma shape of the gaps between arrivals (1 / their squared coefficient of variation).
    gap_shape: float
    input_log_mean: float
    input_log_sd: float
    input_min: int
    input_max: int
    output_log_mean: float
    output_log_sd: float
    output_min: int
    output_max: int


#: Fitted by :func:`fit` on the Azure LLM inference 2023 conversation trace
#: (gtm/data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv, 19,366 requests,
#: CC BY 4.0; Patel et al., "Splitwise", ISCA'24).
AZURE_CONV_FIT = SyntheticFit(
    source="azure-conv",
    span_s=3501.72,
    rate_per_s=5.5304,
    gap_shape=0.8353,
    input_log_mean=6.6333,
    input_log_sd=0.9852,
    input_min=2,
    input_max=14_050,
    output_log_mean=5.0190,
    output_log_sd=0.8590,
    output_min=7,
    output_max=1000,
)


def fit(trace: Trace) -> SyntheticFit:
    """The model of ``trace`` (at least three requests)."""
    requests = trace.requests
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(requests)]
    gap_mean = statistics.fmean(gaps)
    cv = statistics.pstdev(gaps) / gap_mean
    inputs = [max(1, r.input_tokens) for r in requests]
    outputs = [max(1, r.output_tokens) for r in requests]
    log_in = [math.log(x) for x in inputs]
    log_out = [math.log(x) for x in outputs]
    return SyntheticFit(
        source=trace.kind.value,
        span_s=trace.duration_s,
        rate_per_s=trace.rate_per_s,
        gap_shape=1.0 / (cv * cv),
        input_log_mean=statistics.fmean(log_in),
        input_log_sd=statistics.pstdev(log_in),
        input_min=min(inputs),
        input_max=max(inputs),
        output_log_mean=statistics.fmean(log_out),
        output_log_sd=statistics.pstdev(log_out),
        output_min=min(outputs),
        output_max=max(outputs),
    )


def synthetic_trace(model: SyntheticFit = AZURE_CONV_FIT, *, seed: int = 0) -> Trace:
    """Requests drawn from ``model`` over its span, the first at 0 s; the same
    ``seed`` gives the same trace."""
    rng = random.Random(seed)
    gap_scale = 1.0 / (model.rate_per_s * model.gap_shape)  # mean gap = shape × scale
    requests: list[TraceRequest] = []
    at = 0.0
    while at < model.span_s:
        tokens_in = _lognormal(rng, model.input_log_mean, model.input_log_sd)
        tokens_out = _lognormal(rng, model.output_log_mean, model.output_log_sd)
        requests.append(
            TraceRequest(
                at,
                min(max(tokens_in, model.input_min), model.input_max),
                min(max(tokens_out, model.output_min), model.output_max),
            )
        )
        at += rng.gammavariate(model.gap_shape, gap_scale)
    return Trace(TraceKind.SYNTHETIC, f"synthetic (fitted on {model.source}, seed {seed})",
                 tuple(requests))  # fmt: skip


def _lognormal(rng: random.Random, log_mean: float, log_sd: float) -> int:
    return round(rng.lognormvariate(log_mean, log_sd))

"""When the zone lets a request go to a GPU now, or holds it in the agent (``gtm zone
--admission slo``, :mod:`zone_agent.flow`): every form of the rule in this one module, the
scalar reference, the numpy form and the one-GPU check a decision's choice gets first
(:func:`admitted_alone`). ``tests/unit/zone_agent/costs/test_admission.py`` fails when
they admit differently.

Why: goodput counts a request when its TTFT *and* its time per output token (TPOT) are
within the SLO (DistServe, OSDI 2024). A worker that prefills while it decodes stretches
every decode step by the prefill's time (vLLM's chunked prefill puts prompt chunks and
running decodes in the same pass; an H100 pass of 8,192 prompt tokens takes ~0.4 s), so
a prompt sent to a GPU costs the requests decoding there their TPOT. Routers that send
every request at once turn a zone-wide burst into prefill on every GPU, and then almost
no request of the burst meets its TPOT even when its TTFT is fine. Holding the surplus
in the agent (as llm-d's flow control holds requests while its pool is saturated, and
Dynamo's router queues above a busy threshold) keeps each GPU's decoders on time; the
held requests go, shortest first, as room appears.

Per GPU ``g`` of the model (arrays over the decision's positions)::

    queue_ms[g]   = predicted TTFT − the prompt's own part there (its uncached tokens)
    prefill_ms[g] = the prompt's uncached tokens × ms per token there (its prefill time)
    slack_ms[g]   = the least TPOT slack of the requests decoding there on time
                    (inf: none), each request's slack being
                    (tpot_slo − decode step) × (output tokens − 1)
                    minus the prefill sent there after it
    on_time[g]    = predicted TTFT ≤ ttft_slo and its own decode step < tpot_slo

    fits[g]       = queue_ms[g] ≤ budget  and  prefill_ms[g] ≤ slack_ms[g]
    admitted[g]   = fits[g] and on_time[g]   if the request is on time anywhere
                  = fits[g]                  if it is on time nowhere (a long prompt)

So a request that can meet its SLO on some GPU waits for room there rather than go
where it is lost (an L4 whose decode step is over the TPOT bound, a slow GPU that
prefills it past the TTFT bound): it keeps its chance, and the GPU that would have
taken it keeps its passes for requests it can serve. A NaN or infinite ``queue_ms``
(a GPU that cannot prefill) is never admitted. The slack is the TPOT bound's room, in
milliseconds of decode time, that prefill may take while the request decodes: a decode
of ``n`` tokens at ``step`` ms each meets ``tpot_slo`` while the prefill passes it
shares add at most ``(tpot_slo − step)·(n − 1)``.
"""

from __future__ import annotations

import math

from zone_agent.view import Bools, Floats


def tpot_slack_ms(tpot_slo_ms: float, decode_step_ms: float, output_tokens: int) -> float:
    """The prefill time a request's decode can share passes with and still meet the TPOT
    SLO (ms; ≤ 0: none, it is late however the zone places the next prompts). A request
    of one output token has no TPOT: inf."""
    if output_tokens <= 1:
        return math.inf
    return (tpot_slo_ms - decode_step_ms) * (output_tokens - 1)


def admitted_reference(
    queue_ms: Floats,
    prefill_ms: Floats,
    slack_ms: Floats,
    on_time: Bools,
    budget_ms: float,
    /,
) -> list[bool]:
    """The rule one GPU at a time (the definition the numpy form is held to)."""
    # Written as "within": a NaN is then no admission, as in the numpy form.
    fits = [
        bool(float(q) <= budget_ms and float(p) <= float(s))
        for q, p, s in zip(queue_ms, prefill_ms, slack_ms, strict=True)
    ]
    if not any(bool(t) for t in on_time):
        return fits
    return [f and bool(t) for f, t in zip(fits, on_time, strict=True)]


def admitted_numpy(
    queue_ms: Floats,
    prefill_ms: Floats,
    slack_ms: Floats,
    on_time: Bools,
    budget_ms: float,
    /,
) -> Bools:
    """The rule over every GPU at once (a new array)."""
    out: Bools = (queue_ms <= budget_ms) & (prefill_ms <= slack_ms)
    if on_time.any():
        out &= on_time
    return out


def admitted_alone(
    queue_ms: float,
    prefill_ms: float,
    slack_ms: float,
    ttft_ms: float,
    step_ms: float,
    budget_ms: float,
    ttft_slo_ms: float,
    tpot_slo_ms: float,
    /,
) -> bool:
    """Whether one GPU is admitted whatever the others: it fits and the request is on
    time there (so it is on time somewhere, and the rule there is ``fits and on_time``).
    False says nothing of the GPU: ask the whole rule. The check a decision's own GPU
    gets first (most requests go where the profile chose, without the arrays)."""
    return (
        queue_ms <= budget_ms
        and prefill_ms <= slack_ms
        and ttft_ms <= ttft_slo_ms
        and step_ms < tpot_slo_ms
    )


def on_time_reference(
    ttft_ms: Floats, step_ms: Floats, ttft_slo_ms: float, tpot_slo_ms: float, /
) -> list[bool]:
    """Where the request itself can meet the SLO: predicted TTFT within its bound, and
    a decode step under the TPOT bound."""
    return [
        bool(float(t) <= ttft_slo_ms and float(d) < tpot_slo_ms)
        for t, d in zip(ttft_ms, step_ms, strict=True)
    ]


def on_time_numpy(
    ttft_ms: Floats, step_ms: Floats, ttft_slo_ms: float, tpot_slo_ms: float, /
) -> Bools:
    """:func:`on_time_reference` over every GPU at once (a new array)."""
    out: Bools = (ttft_ms <= ttft_slo_ms) & (step_ms < tpot_slo_ms)
    return out


def decode_context_tokens(input_tokens: int, output_tokens: int) -> float:
    """The context a request decodes over, on average (its prompt and half its answer):
    what its decode step is priced at."""
    return float(input_tokens) + 0.5 * max(0, output_tokens)


__all__ = [
    "admitted_alone",
    "admitted_numpy",
    "admitted_reference",
    "decode_context_tokens",
    "on_time_numpy",
    "on_time_reference",
    "tpot_slack_ms",
]

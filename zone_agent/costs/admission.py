"""When the zone lets a request go to a GPU now, or holds it in the agent (``gtm zone
--admission slo``, :mod:`zone_agent.flow`): every form of the rule in this one module, the
scalar reference and the numpy form. ``tests/unit/zone_agent/costs/test_admission.py``
fails when the two admit differently.

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

    queue_ms[g]   = predicted TTFT − the prompt's own part (the cost model's queue)
    prefill_ms[g] = the prompt's tokens × ms per token there (its prefill time)
    slack_ms[g]   = the least TPOT slack of the requests decoding there on time
                    (inf: none), each request's slack being
                    (tpot_slo − decode step) × (output tokens − 1)
                    minus the prefill sent there after it

    admitted[g]   = queue_ms[g] ≤ budget  and  prefill_ms[g] ≤ slack_ms[g]

A NaN or infinite ``queue_ms`` (a GPU that cannot prefill) is never admitted. The
slack is the TPOT bound's room, in milliseconds of decode time, that prefill may take
while the request decodes: a decode of ``n`` tokens at ``step`` ms each meets
``tpot_slo`` while the prefill passes it shares add at most ``(tpot_slo − step)·(n − 1)``.
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
    queue_ms: Floats, prefill_ms: Floats, slack_ms: Floats, budget_ms: float, /
) -> list[bool]:
    """The rule one GPU at a time (the definition the numpy form is held to)."""
    return [
        # Written as "within": a NaN is then no admission, as in the numpy form.
        bool(float(q) <= budget_ms and float(p) <= float(s))
        for q, p, s in zip(queue_ms, prefill_ms, slack_ms, strict=True)
    ]


def admitted_numpy(
    queue_ms: Floats, prefill_ms: Floats, slack_ms: Floats, budget_ms: float, /
) -> Bools:
    """The rule over every GPU at once (a new array)."""
    out: Bools = (queue_ms <= budget_ms) & (prefill_ms <= slack_ms)
    return out


def decode_context_tokens(input_tokens: int, output_tokens: int) -> float:
    """The context a request decodes over, on average (its prompt and half its answer):
    what its decode step is priced at."""
    return float(input_tokens) + 0.5 * max(0, output_tokens)


__all__ = [
    "admitted_numpy",
    "admitted_reference",
    "decode_context_tokens",
    "tpot_slack_ms",
]

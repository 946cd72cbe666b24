"""The zone's predicted-TTFT cost, every form of it in this one module: the per-GPU scalar
reference, the numpy form over a model's GPUs, and the binding of the C kernel
``_ttft.c`` beside this file, which is what decisions run when it is built.

``tests/unit/zone_agent/costs/test_ttft.py`` fails when any two forms give different
floats, so changing the formula is an edit to this module and to ``_ttft.c``. The numpy
form has the kernel's signature (:func:`ttft_costs_numpy`), so either can be called.

ARCHITECTURE §2 at one zone, per GPU (the zone's form of
:func:`gtm.routing.cost.predicted_ttft_ms`, with no RTT inside a zone and the prefill
rate inverted once per view into ``ms_per_token`` — so it rounds apart from that
function in the last bits, which the test bounds)::

    tokens = queued + own
    ttft   = tokens · ms_per_token  +  ⌈tokens / max_batched⌉ · step_extra_ms

* ``queued``: uncached prompt tokens waiting there — the agent's own in-flight requests
  not yet at their first byte, plus other clients' waiting requests seen in a fresh
  scrape (queue length × the prompt tokens the worker computed per request lately,
  :mod:`zone_agent.prompt_sizes`);
* ``own``: this request's prompt tokens minus the leading prefix blocks the agent
  recently sent there (they are in that GPU's prefix cache), so cache affinity is a
  cost term, not a mode;
* ``ms_per_token``: 1000 / the profile's prefill tokens/s for that GPU type and model,
  times the health weight (slow start, throughput regression) — heterogeneous GPUs are
  weighted by what they can do;
* decode pressure (optional): every prefill pass of ``max_num_batched_tokens`` also
  carries the running batch, whose KV reads take time beyond the pass's compute (the
  roofline of :meth:`gtm.gpu_profiles.GpuProfile.forward_time_s`), plus the fixed
  per-pass overhead: ``passes × step_extra``, with the view's ``step_extra`` from the
  last scraped KV usage.

Both terms are divided by the health weight, so a whole cost scales as 1 / weight:
:mod:`zone_agent.costs.slo` multiplies a cost by slow start's part of the weight to
read the prediction without it (``tests/unit/zone_agent/plugins/test_slo_picker.py``
holds this).

Bounded-load stickiness: cache credit is only given where the GPU's in-flight sequences
stay within ``(1+ε)`` times its fair share of the zone's (capacity-weighted: share ∝
prefill rate), the bound of consistent hashing with bounded loads (Mirrokni, Thorup,
Zadimoghaddam, SODA 2018; :func:`gtm.routing.cost.within_bounded_load`). A hot prefix
therefore spreads to a second GPU instead of piling onto one ("death spiral" of
cache-affine routers, sglang PR #14305).

Where the cache credit goes (``matches``) comes in one of two shapes, as the accounting
finds it: a dict position → leading blocks (a few GPUs), or a list of (blocks, bytes of
a little-endian mask of the positions holding exactly that many) when hundreds may.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gtm.routing.cost import within_bounded_load
from zone_agent.view import Floats, Ints

#: Where the cache credit goes (see the module docstring).
Matches = Mapping[int, int] | Sequence[tuple[int, bytes]]

ttft_costs: Callable[..., None] | None
#: The kernel object's class (``new_form``), None without the compiled form.
Kernel: type[_ttft.Kernel] | None
try:  # the compiled form (setup.py builds it when it can)
    from zone_agent.costs import _ttft
    from zone_agent.costs._ttft import ttft_costs

    Kernel = _ttft.Kernel
except ImportError:  # pragma: no cover - an install without a C compiler
    Kernel = ttft_costs = None


# ---------------------------------------------------------------------------- scalar


def load_scale(epsilon: float, streams_total: float, sequences: float, rate_sum: float) -> float:
    """Sequences per unit of prefill rate a GPU may hold and keep its cache credit:
    ``(1+ε) × (in-flight sequences + this request's) / Σ rate`` over the survivors. (An
    input of every form, worked out once per decision.)"""
    return (1.0 + epsilon) * (streams_total + sequences) / max(rate_sum, 1e-9)


def within_cap(streams: float, sequences: float, scale: float, rate: float) -> bool:
    """Whether a GPU at ``rate`` holding ``streams`` keeps its cache credit."""
    return within_bounded_load(streams, sequences, math.ceil(scale * rate))


def credited_tokens(queued: float, prompt: float, blocks: int, per_block: float) -> float:
    """Tokens to prefill at a GPU holding the prompt's first ``blocks`` blocks."""
    return queued + max(0.0, prompt - blocks * per_block)


def cost_at(
    tokens: float, ms_per_token: float, inv_max_batched: float, step_extra_ms: float, decode: bool
) -> float:
    """Predicted TTFT in ms of ``tokens`` to prefill at one GPU."""
    cost = tokens * ms_per_token
    if decode:
        cost += math.ceil(tokens * inv_max_batched) * step_extra_ms
    return cost


def ttft_costs_reference(
    out: Floats,
    pending: Floats,
    streams: Floats,
    slots: Ints,
    external_queued: Floats,
    rate: Floats,
    ms_per_token: Floats,
    inv_max_batched: Floats,
    step_extra_ms: Floats,
    matches: Matches,
    prompt: float,
    per_block: float,
    sequences: float,
    scale: float,
    decode: bool,
    /,
) -> None:
    """The formula one GPU at a time (the definition the other forms are held to)."""
    credit = dict(matches) if isinstance(matches, Mapping) else dict(_group_positions(matches))
    for p in range(len(out)):
        slot = int(slots[p])
        queued = float(pending[slot]) + float(external_queued[p])
        tokens = queued + prompt
        blocks = credit.get(p)
        if blocks is not None and within_cap(float(streams[slot]), sequences, scale, rate[p]):
            tokens = credited_tokens(queued, prompt, blocks, per_block)
        out[p] = cost_at(
            tokens, float(ms_per_token[p]), float(inv_max_batched[p]), step_extra_ms[p], decode
        )


def _group_positions(groups: Sequence[tuple[int, bytes]]) -> list[tuple[int, int]]:
    return [
        (int(p), blocks)
        for blocks, mask in groups
        for p in np.flatnonzero(np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little"))
    ]


# ---------------------------------------------------------------------------- numpy


def ttft_costs_numpy(
    out: Floats,
    pending: Floats,
    streams: Floats,
    slots: Ints,
    external_queued: Floats,
    rate: Floats,
    ms_per_token: Floats,
    inv_max_batched: Floats,
    step_extra_ms: Floats,
    matches: Matches,
    prompt: float,
    per_block: float,
    sequences: float,
    scale: float,
    decode: bool,
    /,
) -> None:
    """The formula over arrays, with the kernel's signature and operations in its order.

    The few GPUs of a dict of matches get their credit one float at a time (a numpy call
    on a small array costs several Python float operations); groups, over arrays.
    """
    queued = pending[slots] + external_queued
    tokens = queued + prompt
    if isinstance(matches, Mapping):
        slot, streams_at, rate_at, queued_at = slots.item, streams.item, rate.item, queued.item
        for position, blocks in matches.items():
            if within_cap(streams_at(slot(position)), sequences, scale, rate_at(position)):
                tokens[position] = credited_tokens(queued_at(position), prompt, blocks, per_block)
    else:
        n = len(out)
        for blocks, mask in matches:
            at = np.flatnonzero(np.unpackbits(np.frombuffer(mask, np.uint8), bitorder="little"))
            if len(at) and at[-1] >= n:
                raise IndexError("ttft_costs: match position out of range")
            at = at[streams[slots[at]] + sequences <= np.ceil(scale * rate[at])]
            tokens[at] = queued[at] + max(0.0, prompt - blocks * per_block)
    np.multiply(tokens, ms_per_token, out=out)
    if decode:
        passes = np.multiply(tokens, inv_max_batched, out=tokens)
        np.ceil(passes, out=passes)
        passes *= step_extra_ms
        out += passes


def alone_costs_numpy(
    prompt: float | Floats,
    ms_per_token: Floats,
    inv_max_batched: Floats,
    step_extra_ms: Floats,
    decode: bool,
    /,
) -> Floats:
    """:func:`cost_at` of the prompt alone at each GPU: no queue, no cache credit (what
    it would wait at best there; a new array). ``prompt`` may be an array, a prompt per
    GPU (its uncached tokens there: the prompt's own part of each GPU's cost)."""
    out = ms_per_token * prompt
    if decode:
        passes = np.multiply(inv_max_batched, prompt)
        np.ceil(passes, out=passes)
        passes *= step_extra_ms
        out += passes
    return out


#: What decisions run: the kernel when it was built, else the numpy form.
TTFT_COSTS: Callable[..., None] = ttft_costs if ttft_costs is not None else ttft_costs_numpy


def new_form() -> Callable[..., None]:
    """The form one model index's decisions call, with the kernel's signature: the
    kernel when it was built — an object of its own that holds the buffers of the arrays
    it was last given, since a view's columns and the accounting's arrays are the same
    objects decision after decision (numpy formats an array's dtype each time it is
    asked for a buffer) — else the numpy form."""
    return Kernel().ttft_costs if Kernel is not None else ttft_costs_numpy


def numpy_form() -> Callable[..., None]:
    """:func:`new_form`'s counterpart that always gives the numpy form (tests)."""
    return ttft_costs_numpy

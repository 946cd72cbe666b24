"""The zone default's score-and-pick, every form of it in this one module: the scalar
reference, the numpy form (the scorers' own arrays and the pick), and the binding of
the C kernel ``_blend.c`` beside this file, which is what the default profile runs when
it is built.

``tests/unit/zone_agent/costs/test_blend.py`` fails when two forms choose differently,
so changing one of these formulas is an edit to this module and to ``_blend.c``:

* free KV blocks at a GPU: the last fresh scrape's, minus what the agent sent there
  since, never below 0 (``max(0, free_base − max(0, own − own_base))``);
* the KV-room score (``kv-cache-scorer``): ``min(1, free × 1/total)``;
* the TTFT score (``ttft-scorer``) of a cost: ``exp((best − cost) × 1/scale)``, 1 for
  the cheapest survivor, 0 for an infinite cost (the zone's form of
  :func:`gtm.routing.cost.cost_to_score`);
* the blend: ``(w_cost·ttft + w_room·room) / Σw`` — the runner's weighted sum, whose
  division is skipped when ``Σw`` is a power of two (it is then exact and keeps every
  order and tie) — and the first survivor of highest total, as ``max-score-picker``
  takes it.

The kernel's ``exp`` is the C library's, as the scalar reference's :func:`math.exp`;
numpy's may differ from both in the last bit, so on a near tie (the best two totals
within :data:`NEAR_TIE`) the kernel answers -1 and the numpy form decides, as the
reference runner does — unless every survivor that close to the top costs exactly the
cheapest cost: their TTFT scores are then ``exp(0) = 1`` in every form and their totals
the same bits, so the kernel takes the first of them itself (the idle zone of identical
GPUs, where every request ties).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from zone_agent.plugins._arrays import first_max_of
from zone_agent.view import Floats, Ints

#: The kernel's margin for a near tie (``NEAR_TIE`` in ``_blend.c``): totals are in
#: [0, 2], and ``exp`` implementations agree to a few ulps.
NEAR_TIE = 1e-12

blend_choice: Callable[..., int] | None
#: The kernel object's class (``new_form``), None without the compiled form.
Kernel: type[_blend.Kernel] | None
try:  # the compiled form (setup.py builds it when it can)
    from zone_agent.costs import _blend
    from zone_agent.costs._blend import blend_choice

    Kernel = _blend.Kernel
except ImportError:  # pragma: no cover - an install without a C compiler
    Kernel = blend_choice = None


# ---------------------------------------------------------------------------- scalar


def free_blocks_at(kv_own: float, kv_own_base: float, kv_free_base: float) -> float:
    """Free KV blocks at one GPU holding ``kv_own`` of our blocks."""
    sent = max(kv_own - kv_own_base, 0.0)
    return max(kv_free_base - sent, 0.0)


def room_at(free: float, inv_total: float) -> float:
    """The KV-room score of one GPU."""
    return min(free * inv_total, 1.0)


def ttft_score_at(cost: float, best: float, inv_scale: float) -> float:
    """The TTFT score of one GPU's cost, given the survivors' cheapest (finite)."""
    return math.exp(min((best - cost) * inv_scale, 0.0))


def total_at(
    score: float, room: float, cost_weight: float, room_weight: float, div: float
) -> float:
    """The blend of one GPU's two scores (``div`` 0: no division)."""
    total = score if cost_weight == 1.0 else score * cost_weight
    total += room if room_weight == 1.0 else room * room_weight
    return total / div if div != 0.0 else total


def blend_totals_reference(
    costs: Floats,
    kv_blocks: Floats,
    slots: Ints,
    kv_own_base: Floats,
    kv_free_base: Floats,
    inv_total: Floats,
    survivors: Ints | None,
    inv_scale: float,
    cost_weight: float,
    room_weight: float,
    weight_sum: float,
    /,
) -> dict[int, float]:
    """Each survivor's total, one GPU at a time (the definition the other forms are
    held to; the kernel's arguments)."""
    at = range(len(costs)) if survivors is None else [int(p) for p in survivors]
    best = min((float(costs[p]) for p in at), default=math.inf)
    out = {}
    for p in at:
        score = ttft_score_at(float(costs[p]), best, inv_scale) if best < math.inf else 0.0
        free = free_blocks_at(float(kv_blocks[slots[p]]), kv_own_base[p], kv_free_base[p])
        out[p] = total_at(score, room_at(free, inv_total[p]), cost_weight, room_weight, weight_sum)
    return out


def first_max(totals: dict[int, float]) -> int:
    """The first position of highest total (positions ascending)."""
    return max(totals, key=lambda p: (totals[p], -p))


# ---------------------------------------------------------------------------- numpy


def free_blocks(kv_own: Floats, kv_own_base: Floats, kv_free_base: Floats) -> Floats:
    """:func:`free_blocks_at` over arrays (a new array)."""
    free = kv_own - kv_own_base  # KV blocks sent since the scrape
    np.maximum(free, 0.0, out=free)
    np.subtract(kv_free_base, free, out=free)
    return np.maximum(free, 0.0, out=free)


def kv_floor_numpy(kv_blocks: Floats, slots: Ints, kv_free_base: Floats, /) -> float:
    """``min(kv_free_base − kv_blocks[slots])`` (NaN if any is NaN): free KV blocks are
    at least this everywhere, since what the agent sent since a scrape is at most its
    whole charge (the fits filter's cheap test; :func:`new_floor_form`)."""
    floor = np.subtract(kv_free_base, kv_blocks[slots])
    return float(floor[floor.argmin()])


def room(free: Floats, inv_total: Floats) -> Floats:
    """:func:`room_at` over arrays (a new array)."""
    out = np.multiply(free, inv_total)
    return np.minimum(out, 1.0, out=out)


def best_cost(costs: Floats, survivors: Ints | None) -> float:
    """The survivors' cheapest cost (``survivors`` None: all; NaN if any is NaN)."""
    live = costs if survivors is None else costs[survivors]
    return float(live[live.argmin()]) if len(live) else math.inf


def ttft_scores(costs: Floats, best: float, inv_scale: float, clamp: bool) -> Floats:
    """:func:`ttft_score_at` over arrays (``best`` finite). ``clamp``: some candidate
    is removed and may cost less than the best (its exponent is clamped to 0: its score
    is ignored, and exp of a large positive number would overflow)."""
    exponent = np.subtract(best, costs)
    exponent *= inv_scale
    if clamp:
        np.minimum(exponent, 0.0, out=exponent)
    return np.exp(exponent, out=exponent)


def blend_totals(
    scores: Floats, rooms: Floats, cost_weight: float, room_weight: float, div: float
) -> Floats:
    """:func:`total_at` over arrays."""
    totals = scores if cost_weight == 1.0 else scores * cost_weight
    totals = totals + (rooms if room_weight == 1.0 else rooms * room_weight)
    return totals / div if div != 0.0 else totals


def blend_choice_numpy(
    costs: Floats,
    kv_blocks: Floats,
    slots: Ints,
    kv_own_base: Floats,
    kv_free_base: Floats,
    inv_total: Floats,
    survivors: Ints | None,
    inv_scale: float,
    cost_weight: float,
    room_weight: float,
    weight_sum: float,
    /,
) -> int:
    """The kernel's choice with numpy, the kernel's signature: never -1 (it decides
    near ties as the reference runner does)."""
    best = best_cost(costs, survivors)
    if best < math.inf:
        scores = ttft_scores(costs, best, inv_scale, survivors is not None)
    else:
        scores = np.zeros(len(costs))
    free = free_blocks(kv_blocks[slots], kv_own_base, kv_free_base)
    totals = blend_totals(scores, room(free, inv_total), cost_weight, room_weight, weight_sum)
    if survivors is None:
        return int(totals.argmax())
    return first_max_of(totals, survivors)


def new_form() -> Callable[..., int]:
    """The form one model index's decisions call, with the kernel's signature: the
    kernel when it was built — an object of its own that holds the buffers of the arrays
    it was last given (all but the costs), since a view's columns, the accounting's KV
    charges and a view's survivors are the same objects decision after decision — else
    the numpy form (which never answers -1)."""
    return Kernel().blend_choice if Kernel is not None else blend_choice_numpy


def new_floor_form() -> Callable[[Floats, Ints, Floats], float]:
    """:func:`kv_floor_numpy`'s form one model index's decisions call: a kernel object's
    (holding its arrays' buffers, as :func:`new_form`) when the kernel was built."""
    return Kernel().kv_floor if Kernel is not None else kv_floor_numpy

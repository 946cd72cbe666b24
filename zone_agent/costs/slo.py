"""Placement for goodput at a TTFT SLO when every GPU is late (``slo-picker``), every
form of the rule in this one module: the scalar reference and the numpy form.
``tests/unit/zone_agent/costs/test_slo.py`` fails when the two choose differently.

Why: under a burst that overloads the whole zone, predicted-TTFT balancing spreads the
lateness — every queue grows alike, so every request misses the SLO together (a zone
of queues a few seconds deep serves almost nothing within a 2 s TTFT bound). Goodput
asks the opposite: keep some queues short enough to meet the SLO and let the late
requests wait together (DistServe, OSDI 2024, defines goodput as the rate of requests
within their TTFT and TPOT bounds; routers that balance counts shed load onto their
slowest GPU by accident, which is why they can beat a TTFT balancer on it). The rule,
per GPU position ``p`` among the survivors::

    late_p  = cost_p × ramp_p         (the prediction without slow start's preference)
    alone_p = alone cost_p × ramp_p   (the prompt by itself there: no queue)

* on time — some ``late_p ≤ slo``: no choice here (-1), the profile's scores decide;
* hopeless — every ``alone_p > slo``: the prompt itself is the lateness (a long
  prompt), not the queue; no choice here, so it gets its best TTFT (the tail);
* late because of queueing: the survivor of *highest* ``late_p ≤ cap`` (ties: the
  first), where the lateness already is; none within the cap: no choice here.

``cap`` bounds what a late request is made to wait (the tail, p99, rises to about it).
"""

from __future__ import annotations

import math

from zone_agent.view import Floats, Ints

#: The rule makes no choice: the profile's scores decide.
NO_CHOICE = -1


def late_choice_reference(
    costs: Floats,
    alone: Floats,
    ramp: Floats,
    survivors: Ints | None,
    slo_ms: float,
    cap_ms: float,
    /,
) -> int:
    """The rule one GPU at a time (the definition the numpy form is held to)."""
    at = range(len(costs)) if survivors is None else [int(p) for p in survivors]
    late = {p: float(costs[p]) * float(ramp[p]) for p in at}
    # Written as "all later than": a NaN is then no verdict, as in the numpy form.
    if not late or not all(v > slo_ms for v in late.values()):
        return NO_CHOICE
    if all(float(alone[p]) * float(ramp[p]) > slo_ms for p in at):
        return NO_CHOICE
    within = [p for p in at if late[p] <= cap_ms]
    if not within:
        return NO_CHOICE
    return max(within, key=lambda p: (late[p], -p))


def late_choice_numpy(
    costs: Floats,
    alone: Floats,
    ramp: Floats,
    survivors: Ints | None,
    slo_ms: float,
    cap_ms: float,
    /,
) -> int:
    """:func:`late_choice_reference` over arrays."""
    if not is_late_numpy(costs, ramp, survivors, slo_ms):  # on time (NaN: no verdict)
        return NO_CHOICE
    if survivors is not None:
        costs, alone, ramp = costs[survivors], alone[survivors], ramp[survivors]
    late = costs * ramp
    alone = alone * ramp
    if alone.min() > slo_ms:
        return NO_CHOICE
    late[~(late <= cap_ms)] = -math.inf  # beyond the cap (or NaN): never taken
    at = int(late.argmax())
    if not late[at] > -math.inf:
        return NO_CHOICE
    return at if survivors is None else int(survivors[at])


def is_late_numpy(costs: Floats, ramp: Floats, survivors: Ints | None, slo_ms: float) -> bool:
    """Whether every survivor is predicted later than ``slo_ms``: the rule's first test,
    which the picker makes before it works out the prompt alone (None of it: on time)."""
    late = costs * ramp if survivors is None else costs[survivors] * ramp[survivors]
    return bool(len(late)) and bool(late.min() > slo_ms)


__all__ = ["NO_CHOICE", "is_late_numpy", "late_choice_numpy", "late_choice_reference"]

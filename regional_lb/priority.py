"""How a region's traffic divides between its own zones (P0) and its peers (P1).

Two modes (:class:`SplitMode`); the regional router draws each request's side from its
request id, so a share of ``local_load`` stays home and the rest is spilled proactively
(before any zone is full; full zones spill on their own, see :mod:`regional_lb.router`).

**Capacity-aware split** (the default, :func:`capacity_split`). Spill exactly the part
of the demand the region's zones cannot take:

* *demand* is measured at admission (:class:`DemandMeter`): a smoothed rate of the
  prompt tokens the region admitted for the model — spilled requests included. It does
  not depend on where requests went, so the split does not feed back into its own input.
  (A rate of *served* load would: spill more → serve less → look idle → spill less →
  overload → spill more, an oscillation.)
* *headroom* is measured per zone from its summary (:func:`zone_headroom`): the prefill
  tokens/s it can take at the target utilisation, minus what it must first work off of
  its queue (pending tokens, ours since the summary included) within the backlog
  horizon. A zone that is drained, unhealthy or dark has none. Concurrency and KV
  cache limits are not rates: the zone profile's saturation filter applies them to each
  request (:func:`regional_lb.view.is_saturated`), and what no zone can take spills as
  ``saturated`` or queues.
* ``spill = min(demand − Σ headroom, peers' headroom) / demand`` (never below 0): a
  region spills only when its remaining zones really cannot take the load, then only
  the excess, and no more than the allowed peers can take — their headroom, the same
  formula over their region summaries. When every region is short (a global overload),
  spilling only moves queues around and adds a hop: the excess then waits at home (fair
  queue) or spills as ``saturated`` when a zone is full and a peer is not.

The backlog term closes the loop on a slow, damped path: a zone that falls behind the
estimate (prefix-cache misses, long decodes) takes proportionally less until its queue
is back within the horizon; it never swings between "all" and "nothing".

**Envoy's priority levels** (:func:`split`, ``SplitMode.ENVOY``), health-count based
(code-style anchors, "Envoy's upstream model"):

* **Overprovisioning** (envoyproxy.io, "Priority levels" / "Overprovisioning factor"):
  a level's health — healthy over total capacity, here GPUs for the model — is scaled by
  the overprovisioning factor 1.4 and capped at 100 %, so a region that is at least
  1/1.4 ≈ 71 % healthy keeps all its traffic; below that, the shortfall goes to P1.
  It ignores load: losing one of two zones spills 30 % even when the survivor could
  carry everything (chaos scenario ``zone-loss``), which is why it is not the default.
* **Normalisation**: when the levels' scaled healths add up to less than 100 %, load is
  split in proportion to them.
* **Panic** (envoyproxy.io, "Panic threshold", default 50 %): when the normalised total
  health is below 100 % and a level's own health is below the threshold, that level
  ignores health and balances over all its hosts — a health signal that condemns most of
  a region at once is more likely wrong than right. Both modes use this rule.

Pure functions, plus the demand meter (sans-io: time is passed in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

#: Envoy's default overprovisioning factor, 1.4 ("overprovisioning_factor" in
#: envoyproxy.io's ClusterLoadAssignment.Policy docs: 140 = 1.4).
OVERPROVISIONING_FACTOR = 1.4
#: Envoy's default panic threshold, 50 % (envoyproxy.io, "Panic threshold").
PANIC_THRESHOLD = 0.5
#: Share of a zone's prefill capacity the split plans to use: Google Cloud's default
#: target for load-balanced backends ("utilizationTarget ... If not defined, the default
#: is 0.8", compute v1 AutoscalingPolicyLoadBalancingUtilization). The remaining 20 %
#: absorbs arrival bursts, so queueing delay stays bounded (at 80 % an M/M/1 queue
#: waits 4 service times; at 95 %, 19).
TARGET_UTILISATION = 0.8
#: A zone's queue must be worked off within this horizon, s: the TTFT bound of the
#: goodput SLO (TTFT ≤ 2 s, issue 10, ``fleetsim/metrics.py``). Pending tokens /
#: horizon is the part of the zone's rate its backlog already claims.
BACKLOG_HORIZON_S = 2.0
#: Time constant of the admitted-demand average, s: Finagle's default decay time for
#: its load balancer's moving averages (``Balancers.p2cPeakEwma(decayTime =
#: 10.seconds)``). Ten times the zone summaries' 1 s publish interval and three times
#: their 3 s lease, so losing a zone is seen long before the demand estimate moves, and
#: at 1 request/s the estimate's noise is 1/√(2 · 10) ≈ 22 %.
DEMAND_DECAY_S = 10.0
#: Models the demand meter remembers (requests name arbitrary models before a zone
#: refuses them; the meter must stay bounded).
DEMAND_MAX_MODELS = 1024


class SplitMode(StrEnum):
    """How the region decides what share of its traffic to spill proactively."""

    CAPACITY = "capacity"  # measured headroom vs admitted demand (default)
    ENVOY = "envoy"  # Envoy's health-count overprovisioning (factor 1.4)


@dataclass(frozen=True, slots=True)
class PrioritySplit:
    """How traffic divides between the region (P0) and its peers (P1)."""

    local_load: float
    spill_load: float
    local_health: float
    spill_health: float
    local_panic: bool
    #: Capacity mode: the admitted demand and the zones' headroom, prompt tokens/s
    #: (NaN in Envoy mode, which does not measure them).
    demand_tokens_per_s: float = math.nan
    headroom_tokens_per_s: float = math.nan
    peer_headroom_tokens_per_s: float = math.nan

    @property
    def degraded(self) -> bool:
        return self.spill_load > 0.0


@dataclass(frozen=True, slots=True)
class CapacitySettings:
    """The capacity-aware split's constants (see the module docstring)."""

    target_utilisation: float = TARGET_UTILISATION
    backlog_horizon_s: float = BACKLOG_HORIZON_S
    demand_decay_s: float = DEMAND_DECAY_S

    def __post_init__(self) -> None:
        if not 0.0 < self.target_utilisation <= 1.0:
            raise ValueError(
                f"target_utilisation must be in (0, 1], got {self.target_utilisation!r}"
            )
        for name in ("backlog_horizon_s", "demand_decay_s"):
            value = getattr(self, name)
            if not (value > 0.0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def health(healthy: float, total: float) -> float:
    """Healthy share of a level's capacity, in [0, 1] (0 for an empty level)."""
    if total <= 0:
        return 0.0
    return max(0.0, min(1.0, healthy / total))


def split(
    local: tuple[float, float],
    peers: tuple[float, float],
    *,
    factor: float = OVERPROVISIONING_FACTOR,
    panic_threshold: float = PANIC_THRESHOLD,
) -> PrioritySplit:
    """Envoy's P0/P1 split for (healthy, total) capacities of the region and its peers."""
    return PrioritySplit(*_envoy(local, peers, factor, panic_threshold))


def _envoy(
    local: tuple[float, float], peers: tuple[float, float], factor: float, panic_threshold: float
) -> tuple[float, float, float, float, bool]:
    """:func:`split`'s (local load, spill load, local health, spill health, panic)."""
    h0, h1 = health(*local), health(*peers)
    e0, e1 = min(1.0, h0 * factor), min(1.0, h1 * factor)
    total = e0 + e1
    if total >= 1.0:
        load0 = e0
        load1 = 1.0 - e0
    elif total > 0.0:
        load0, load1 = e0 / total, e1 / total
    else:
        load0, load1 = 1.0, 0.0  # nothing healthy anywhere: stay home (and panic)
    panic = min(1.0, total) < 1.0 and h0 < panic_threshold
    return load0, load1, h0, h1, panic


def zone_headroom(
    prefill_tokens_per_s: float,
    pending_tokens: float,
    *,
    target_utilisation: float = TARGET_UTILISATION,
    backlog_horizon_s: float = BACKLOG_HORIZON_S,
) -> float:
    """Prompt tokens/s a zone can take on: its prefill rate at the target utilisation,
    less the share its pending tokens claim over the backlog horizon (never negative).

    Equivalently ``rate × (target − queueing delay / horizon)``, with the queueing part
    of the zone's predicted TTFT (pending / rate, ARCHITECTURE §2): a zone whose queue
    already takes 0.8 × 2 s = 1.6 s to work off has no headroom left."""
    if prefill_tokens_per_s <= 0.0:
        return 0.0
    free = prefill_tokens_per_s * target_utilisation - max(0.0, pending_tokens) / backlog_horizon_s
    return max(0.0, free)


def capacity_split(
    headroom_tokens_per_s: float,
    demand_tokens_per_s: float,
    local: tuple[float, float],
    peers: tuple[float, float],
    *,
    peer_headroom_tokens_per_s: float = math.inf,
    panic_threshold: float = PANIC_THRESHOLD,
) -> PrioritySplit:
    """Keep what the zones' headroom covers of the admitted demand; spill the excess,
    up to what the peers' headroom can take.

    ``local``/``peers`` are (healthy, total) GPU counts, for the health figures and
    Envoy's panic rule (a capacity split still panics when most of the region is
    condemned and the peers cannot take the rest)."""
    headroom = max(0.0, headroom_tokens_per_s)
    demand = max(0.0, demand_tokens_per_s)
    elsewhere = max(0.0, peer_headroom_tokens_per_s)
    excess = min(max(0.0, demand - headroom), elsewhere)
    spill = 0.0 if demand <= 0.0 else min(1.0, excess / demand)
    _, _, local_health, spill_health, panic = _envoy(
        local, peers, OVERPROVISIONING_FACTOR, panic_threshold
    )
    return PrioritySplit(
        1.0 - spill, spill, local_health, spill_health, panic, demand, headroom, elsewhere
    )


class DemandMeter:
    """Per model, an exponentially decaying rate of what the region admitted: prompt
    tokens/s and requests/s (sans-io: pass ``now``, monotonic seconds).

    Each admission adds its weight to a sum that decays with time constant ``decay_s``;
    the rate is that sum over ``decay_s`` — a steady stream of ``r`` tokens/s converges
    to ``r`` (within 1/e after one ``decay_s``, 5 % after three). A fresh meter reads
    low for the first few ``decay_s``: the split then keeps traffic home, and full zones
    still spill on their own."""

    def __init__(
        self, decay_s: float = DEMAND_DECAY_S, *, max_models: int = DEMAND_MAX_MODELS
    ) -> None:
        if not (decay_s > 0.0 and math.isfinite(decay_s)):
            raise ValueError(f"decay_s must be a positive number of seconds, got {decay_s!r}")
        if max_models < 1:
            raise ValueError("max_models must be >= 1")
        self.decay_s = decay_s
        self._max_models = max_models
        # model -> [token sum, request sum, time of the sums]
        self._sums: dict[str, list[float]] = {}

    def add(self, model: str, tokens: float, now: float) -> None:
        sums = self._sums.get(model)
        if sums is None:
            if len(self._sums) >= self._max_models:
                self._forget_oldest()
            sums = self._sums[model] = [0.0, 0.0, now]
        decay = self._decay(sums, now)
        sums[0] = sums[0] * decay + max(0.0, tokens)
        sums[1] = sums[1] * decay + 1.0
        sums[2] = max(sums[2], now)

    def tokens_per_s(self, model: str, now: float) -> float:
        sums = self._sums.get(model)
        return 0.0 if sums is None else sums[0] * self._decay(sums, now) / self.decay_s

    def requests_per_s(self, model: str, now: float) -> float:
        sums = self._sums.get(model)
        return 0.0 if sums is None else sums[1] * self._decay(sums, now) / self.decay_s

    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self._sums))

    def _decay(self, sums: list[float], now: float) -> float:
        return math.exp(-max(0.0, now - sums[2]) / self.decay_s)

    def _forget_oldest(self) -> None:
        oldest = min(self._sums, key=lambda model: (self._sums[model][2], model))
        del self._sums[oldest]

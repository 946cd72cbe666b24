"""Envoy's priority-level arithmetic, applied to a region (P0) and its peers (P1).

The regional LB treats its own zones as Envoy's priority 0 and the residency-allowed
peer regions as priority 1 (code-style anchors, "Envoy's upstream model": global_lb
picks localities, regional_lb does priority spillover with overprovisioning and panic):

* **Overprovisioning** (envoyproxy.io, "Priority levels" / "Overprovisioning factor"):
  a level's health — healthy over total capacity, here GPUs for the model — is scaled by
  the overprovisioning factor 1.4 and capped at 100 %, so a region that is at least
  1/1.4 ≈ 71 % healthy keeps all its traffic; below that, the shortfall goes to P1.
  One sick zone then sheds load to peers in proportion, instead of its share landing
  wholly on the remaining zones and overloading them.
* **Normalisation**: when the levels' scaled healths add up to less than 100 %, load is
  split in proportion to them.
* **Panic** (envoyproxy.io, "Panic threshold", default 50 %): when the normalised total
  health is below 100 % and a level's own health is below the threshold, that level
  ignores health and balances over all its hosts — a health signal that condemns most of
  a region at once is more likely wrong than right.

Pure functions; the regional router draws each request's level from its request id.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Envoy's default overprovisioning factor, 1.4 ("overprovisioning_factor" in
#: envoyproxy.io's ClusterLoadAssignment.Policy docs: 140 = 1.4).
OVERPROVISIONING_FACTOR = 1.4
#: Envoy's default panic threshold, 50 % (envoyproxy.io, "Panic threshold").
PANIC_THRESHOLD = 0.5


@dataclass(frozen=True, slots=True)
class PrioritySplit:
    """How traffic divides between the region (P0) and its peers (P1)."""

    local_load: float
    spill_load: float
    local_health: float
    spill_health: float
    local_panic: bool

    @property
    def degraded(self) -> bool:
        return self.spill_load > 0.0


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
    """The P0/P1 split for (healthy, total) capacities of the region and its peers."""
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
    return PrioritySplit(load0, load1, h0, h1, panic)

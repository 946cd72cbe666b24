"""A sans-io token bucket: the caller passes the time, so tests drive it with a fake clock.

A bucket refills at ``rate`` units a second up to ``burst`` units. A request for
``amount`` units is admitted when the bucket holds ``min(amount, burst)``, and then
takes the whole ``amount`` — the level may go negative. That is what lets one request
larger than the burst through at all (a 10,000-token prompt against a 1,700-token
burst), and it is still exact over time: the debt is paid back by refill before
anything else is admitted. Over any window of ``T`` seconds a bucket admits at most

    burst + rate · T + max(0, largest request − burst)

units (the full bucket at the start, the refill, and one oversize request's debt).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """``rate`` units/s up to ``burst``; ``level`` as of ``stamp`` (monotonic seconds)."""

    rate: float
    burst: float
    level: float
    stamp: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        _check(rate, burst)
        return cls(rate, burst, burst, now)

    def _refill(self, now: float) -> None:
        elapsed = now - self.stamp
        if elapsed > 0.0:
            self.level = min(self.burst, self.level + elapsed * self.rate)
            self.stamp = now

    def available(self, now: float) -> float:
        """Units in the bucket at ``now`` (negative while a debt is being paid back)."""
        self._refill(now)
        return self.level

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` would be admitted (0: now; ``inf``: never at rate 0)."""
        self._refill(now)
        if amount > 0.0 and self.burst <= 0.0:
            return math.inf  # an empty share admits nothing, not everything
        need = min(amount, self.burst)
        if self.level >= need:
            return 0.0
        if self.rate <= 0.0:
            return math.inf
        return (need - self.level) / self.rate

    def take(self, amount: float, now: float) -> None:
        """Charge ``amount`` (call after :meth:`wait_for` said 0; may leave a debt)."""
        self._refill(now)
        self.level -= amount

    def give_back(self, amount: float, now: float) -> None:
        """Refund ``amount`` (never above the burst: refunds must not create bursts)."""
        self._refill(now)
        self.level = min(self.burst, self.level + amount)

    def reconfigure(self, rate: float, burst: float, now: float) -> None:
        """New rate and burst from ``now`` on; the level is kept but capped at the burst."""
        _check(rate, burst)
        self._refill(now)
        self.rate = rate
        self.burst = burst
        self.level = min(self.level, burst)


def _check(rate: float, burst: float) -> None:
    if not (math.isfinite(rate) and rate >= 0.0 and math.isfinite(burst) and burst >= 0.0):
        raise ValueError(f"a token bucket needs a finite rate and burst >= 0, got {rate}, {burst}")

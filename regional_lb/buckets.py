"""A sans-io token bucket: the caller passes the time, so tests drive it with a fake clock.

A bucket refills at ``rate`` units a second up to ``burst`` units. A request for
``amount`` units is admitted when the bucket holds ``min(amount, burst)``, and then
takes the whole ``amount`` — the level may go negative. That is what lets one request
larger than the burst through at all (a 10,000-token prompt against a 1,700-token
burst), and it is still exact over time: the debt is paid back by refill before
anything else is admitted.

**Burst allowance** (a loan). A bucket may also hold up to ``allowance`` units of
*credit*: a request the level cannot cover is admitted when the credit covers it, and
takes its amount from the credit *and* the level. The level's debt is then paid back by
refill before the bucket admits anything else, so a burst on credit is paid for by the
quiet time after it, not added to the rate. Credit is earned back only by refill that
overflows a full bucket (while the bucket is not used up to its rate), so it serves a
first burst after a quiet spell, not every second. Over any window of ``T`` seconds a
bucket admits at most

    burst + allowance + rate · T + max(0, largest request − burst)

units (the full bucket and credit at the start, the refill, and one oversize request's
debt); with ``allowance`` 0 it is the plain token bucket. A bucket of burst 0 (a share
of 0) admits on credit alone: up to ``allowance``, never at its rate. A bucket that starts full and
spends its credit at once admits, over the ``allowance / rate`` seconds after, no more
than ``burst + allowance`` plus what refills above the debt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """``rate`` units/s up to ``burst``; ``level`` as of ``stamp`` (monotonic seconds);
    ``credit`` of at most ``allowance`` units to lend (see the module docstring)."""

    rate: float
    burst: float
    level: float
    stamp: float
    allowance: float = 0.0
    credit: float = 0.0

    @classmethod
    def full(cls, rate: float, burst: float, now: float, allowance: float = 0.0) -> TokenBucket:
        _check(rate, burst)
        _check(0.0, allowance)
        return cls(rate, burst, burst, now, allowance, allowance)

    def _fill(self, amount: float) -> None:
        """Add ``amount`` to the level; what overflows the burst becomes credit."""
        room = self.burst - self.level
        if amount <= room:
            self.level += amount
            return
        self.level = max(self.level, self.burst)
        self.credit = min(self.allowance, self.credit + amount - max(0.0, room))

    def _refill(self, now: float) -> None:
        elapsed = now - self.stamp
        if elapsed > 0.0:
            self._fill(elapsed * self.rate)
            self.stamp = now

    def available(self, now: float) -> float:
        """Units in the bucket at ``now`` (negative while a debt is being paid back)."""
        self._refill(now)
        return self.level

    def _covered(self, amount: float) -> bool:
        # An empty bucket (burst 0: a share of 0) covers nothing; only its credit lends.
        return self.level >= min(amount, self.burst) and (self.burst > 0.0 or amount <= 0.0)

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` would be admitted (0: now; ``inf``: never at rate 0)."""
        self._refill(now)
        if self._covered(amount) or self.credit >= amount:
            return 0.0
        if self.burst <= 0.0:
            return math.inf  # an empty share admits only on credit, never at its rate
        if self.rate <= 0.0:
            return math.inf
        return (min(amount, self.burst) - self.level) / self.rate

    def take(self, amount: float, now: float) -> None:
        """Charge ``amount`` (call after :meth:`wait_for` said 0; may leave a debt); an
        amount the level does not cover is lent by the credit."""
        self._refill(now)
        if not self._covered(amount):
            self.credit = max(0.0, self.credit - amount)
        self.level -= amount

    def give_back(self, amount: float, now: float) -> None:
        """Refund ``amount``: it pays back a debt first; beyond a full bucket it becomes
        credit again, never level (refunds must not create bursts)."""
        self._refill(now)
        self._fill(amount)

    def reconfigure(
        self, rate: float, burst: float, now: float, allowance: float | None = None
    ) -> None:
        """New rate and burst (and allowance) from ``now`` on; the level is kept but
        capped at the new burst, the credit at the new allowance less the debt."""
        _check(rate, burst)
        self._refill(now)
        self.rate = rate
        self.burst = burst
        self.level = min(self.level, burst)
        if allowance is not None:
            _check(0.0, allowance)
            self.allowance = allowance
            # What is still owed counts against the new allowance: lent and unpaid
            # units and the credit left never exceed it together.
            self.credit = min(self.credit, max(0.0, allowance - max(0.0, -self.level)))


def _check(rate: float, burst: float) -> None:
    if not (math.isfinite(rate) and rate >= 0.0 and math.isfinite(burst) and burst >= 0.0):
        raise ValueError(f"a token bucket needs a finite rate and burst >= 0, got {rate}, {burst}")

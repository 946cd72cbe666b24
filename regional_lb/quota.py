"""Tenant quotas at one regional LB replica: token buckets on an injected clock (sans-io).

Each tenant's limits come from its policy (:class:`policies.documents.Quotas`):
requests/min, input tokens/min, output tokens/min, weighted tokens/min (input +
``output_weight`` × output) and concurrent requests. A replica enforces a fraction of
them:

    replica limit = tenant quota × pool fraction × lease share

* **pool fraction** — the tenant's regional share for this region (``regional_shares``);
  regions not listed share what the listed ones leave (``1 − Σ shares``), as one pool.
* **lease share** — this replica's part of the pool, granted by the capacity leases of
  :mod:`regional_lb.leases` (1.0 for a replica alone; a safe share when the store is
  unreachable). A :class:`Grant` carries its expiry, so a replica that stops hearing
  from the store falls back to the safe share on time even between refreshes.

Admission charges an *estimate* (prompt tokens counted from the body; output tokens =
``max_tokens`` or a default — OpenAI's own rate limiter charges ``max_tokens`` up
front, platform.openai.com docs "Rate limits"), and :meth:`QuotaLimiter.finish`
reconciles with the usage the response reports. Requests that never ran (a queue
timeout) are refunded.

Per-minute limits are enforced as per-second rates with a one-second burst, as OpenAI
documents for its own limits ("your rate limit may be quantized, e.g. 60,000
requests/minute may be enforced as 1,000 requests/second").

**Burst allowance.** A replica's share of a pool starts as an even split (or what the
pool's lease records say of the tenant's demand, :mod:`regional_lb.leases`), so on a
rate alone a fresh tenant's first burst would be refused beyond a second of its share —
with six regions in one pool, 59 of its first 60 requests. So each bucket may lend up to
``burst_allowance × grant.allowance`` of the *pool's* per-minute limit on credit
(:mod:`.buckets`): a first burst up to the per-minute quota passes at once, and its debt
is paid back by the share's refill before the replica admits more — a burst is paid for
by the quiet time after it, never added to the rate. The lease rounds set
``grant.allowance``: the whole pool while the pool's other replicas are idle (their
budget is what the burst borrows), this replica's fair share once they show demand.
A share of 0 (a replica whose first lease claim collided, until a claim is verified)
still lends its allowance, rate and concurrency alike: it adds nothing to the pool's
Σ shares, only the credit already counted below. Over a window of ``T`` seconds a
replica admits at most

    limit × share × (T + burst_seconds) / 60 + allowance + one oversize request

and the credit comes back only with refill beyond a full bucket (quiet time).
``burst_allowance=0`` gives the strict per-second quantisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from gtm.usage import Usage as Usage
from policies.documents import Quotas, Tenant
from regional_lb.buckets import TokenBucket

#: Pool id of the regions a tenant's ``regional_shares`` do not list.
UNLISTED_POOL = "unlisted"


class Dimension(StrEnum):
    """What a quota limits; the ``reason`` label of rejections."""

    REQUESTS = "requests"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    WEIGHTED_TOKENS = "weighted_tokens"
    CONCURRENCY = "concurrency"


_RATE_DIMENSIONS = (
    Dimension.REQUESTS,
    Dimension.INPUT_TOKENS,
    Dimension.OUTPUT_TOKENS,
    Dimension.WEIGHTED_TOKENS,
)


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """How a replica turns per-minute quotas into buckets."""

    #: Seconds of rate a bucket holds (see the module docstring).
    burst_seconds: float = 1.0
    #: Output tokens charged on admission when the request names no ``max_tokens``.
    default_output_tokens: int = 256
    #: Longest Retry-After advertised (a share of 0 would otherwise say "never").
    max_retry_after_s: float = 60.0
    #: Fraction of the pool's per-minute limit a replica may admit at once on credit
    #: (module docstring): 1.0 lets a first burst through up to the per-minute quota.
    burst_allowance: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.burst_allowance) and self.burst_allowance >= 0.0):
            raise ValueError(f"burst_allowance must be >= 0, got {self.burst_allowance!r}")


@dataclass(frozen=True, slots=True)
class Pool:
    """Which part of a tenant's quotas this region draws on."""

    id: str
    fraction: float


def pool_of(tenant: Tenant, region: str) -> Pool:
    """The tenant's pool for ``region``: its listed share, or the unlisted remainder."""
    for share in tenant.regional_shares:
        if share.region == region:
            return Pool(region, share.share)
    rest = 1.0 - math.fsum(s.share for s in tenant.regional_shares)
    return Pool(UNLISTED_POOL, max(0.0, min(1.0, rest)))


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease share valid until ``valid_until`` (monotonic s); ``fallback`` after that.

    ``allowance``: the fraction of the pool's per-minute limit this replica may admit at
    once on credit (times :attr:`QuotaSettings.burst_allowance`; module docstring)."""

    share: float
    valid_until: float
    fallback: float
    allowance: float = 1.0

    def at(self, now: float) -> float:
        return self.share if now < self.valid_until else self.fallback

    def allowance_at(self, now: float) -> float:
        """The allowance in force: without a valid lease, no more than the fallback
        share (the others' demand can no longer be seen)."""
        return self.allowance if now < self.valid_until else min(self.allowance, self.fallback)


@dataclass(frozen=True, slots=True)
class Cost:
    """What one request asks for (estimates on admission)."""

    input_tokens: int
    output_tokens: int

    def weighted(self, output_weight: float) -> float:
        return self.input_tokens + output_weight * self.output_tokens


@dataclass(frozen=True, slots=True)
class Rejection:
    """Over quota: which limit, when to retry, and a message for the client."""

    tenant: str
    reason: Dimension
    retry_after_s: float
    message: str


@dataclass(slots=True)
class Ticket:
    """An admitted request's charge; hand it back to :meth:`QuotaLimiter.finish` once."""

    tenant: str
    cost: Cost
    weighted: float
    open: bool = True


@dataclass(slots=True)
class Demand:
    """Units asked for since the last :meth:`QuotaLimiter.take_demand` (incl. rejected)."""

    units: dict[Dimension, float] = field(default_factory=dict)
    peak_concurrency: int = 0


class QuotaLimiter:
    """Every tenant's quota state at one replica. Synchronous: the caller passes ``now``.

    Not thread-safe; the asyncio service calls it from its one event loop.
    """

    def __init__(self, settings: QuotaSettings | None = None) -> None:
        self._settings = settings or QuotaSettings()
        self._tenants: dict[str, _Tenant] = {}

    @property
    def settings(self) -> QuotaSettings:
        return self._settings

    # ------------------------------------------------------------------ configuration

    def configure(
        self, tenant: str, quotas: Quotas, fraction: float, grant: Grant, now: float
    ) -> None:
        """Set (or replace, after a policy reload) a tenant's quotas and pool fraction.

        ``grant`` is the lease share a *new* tenant starts with; a replaced tenant keeps
        the grant in force, its bucket levels and its in-flight count, so a policy
        reload neither refills its buckets nor forgets its running requests.
        """
        previous = self._tenants.get(tenant)
        if previous is not None:
            grant = previous.grant
        state = _Tenant(quotas, fraction, self._settings, grant, now)
        if previous is not None:
            state.inherit(previous, now)
        self._tenants[tenant] = state

    def forget(self, tenant: str) -> None:
        """Drop a tenant that left the policy (its open tickets finish harmlessly)."""
        self._tenants.pop(tenant, None)

    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted(self._tenants))

    def has(self, tenant: str) -> bool:
        return tenant in self._tenants

    def set_grant(self, tenant: str, grant: Grant) -> None:
        state = self._tenants.get(tenant)
        if state is not None:
            state.grant = grant

    def share(self, tenant: str, now: float) -> float:
        """The lease share in force for ``tenant`` at ``now`` (0 for an unknown tenant)."""
        state = self._tenants.get(tenant)
        return 0.0 if state is None else state.grant.at(now)

    def limits(self, tenant: str, now: float) -> dict[Dimension, float]:
        """This replica's current limits: per minute (concurrency: requests)."""
        state = self._tenants.get(tenant)
        if state is None:
            return {}
        share = state.grant.at(now)
        return {dim: pool * share for dim, pool in state.per_minute.items()}

    def pool_limits(self, tenant: str) -> dict[Dimension, float]:
        """The whole pool's limits (every replica together), per minute."""
        state = self._tenants.get(tenant)
        return {} if state is None else dict(state.per_minute)

    def credit(self, tenant: str, now: float) -> dict[Dimension, float]:
        """Units each rate limit may still lend at ``now`` (the burst allowance left)."""
        state = self._tenants.get(tenant)
        if state is None:
            return {}
        for bucket in state.buckets.values():
            bucket.available(now)
        return {dim: bucket.credit for dim, bucket in state.buckets.items()}

    def in_flight(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return 0 if state is None else state.in_flight

    # ------------------------------------------------------------------ admission

    def admit(self, tenant: str, cost: Cost, now: float) -> Ticket | Rejection:
        """Charge ``cost`` to every limit of ``tenant``, or say which limit refuses.

        A tenant without quotas configured here is admitted unmetered (the caller has
        already authenticated it; a tenant without a ``quotas`` block is unlimited).
        """
        state = self._tenants.get(tenant)
        if state is None:
            return Ticket(tenant, cost, 0.0, open=False)
        return state.admit(tenant, cost, now, self._settings)

    def finish(
        self, ticket: Ticket, now: float, *, usage: Usage | None = None, refund: bool = False
    ) -> None:
        """Close a ticket: release its concurrency slot and reconcile its charge.

        ``refund``: the request never ran (queue timeout, upstream refused it before
        starting); everything it was charged is given back. Otherwise ``usage`` (when
        the response reported it) replaces the estimate. Closing twice does nothing.
        """
        if not ticket.open:
            return
        ticket.open = False
        state = self._tenants.get(ticket.tenant)
        if state is not None:
            state.finish(ticket, now, usage=usage, refund=refund)

    def take_demand(self, tenant: str) -> Demand:
        """What ``tenant`` asked for since the previous call (for lease wants)."""
        state = self._tenants.get(tenant)
        if state is None:
            return Demand()
        demand = state.demand
        state.demand = Demand(peak_concurrency=state.in_flight)
        return demand


class _Tenant:
    """One tenant: a bucket per rate limit, a concurrency counter, the grant in force."""

    __slots__ = (
        "buckets",
        "configured_allowance",
        "configured_share",
        "demand",
        "grant",
        "in_flight",
        "max_concurrent",
        "output_weight",
        "per_minute",
        "settings",
    )

    def __init__(
        self, quotas: Quotas, fraction: float, settings: QuotaSettings, grant: Grant, now: float
    ) -> None:
        self.settings = settings
        self.grant = grant
        self.output_weight = quotas.output_weight
        self.in_flight = 0
        self.demand = Demand()
        limits = {
            Dimension.REQUESTS: quotas.requests_per_minute,
            Dimension.INPUT_TOKENS: quotas.input_tokens_per_minute,
            Dimension.OUTPUT_TOKENS: quotas.output_tokens_per_minute,
            Dimension.WEIGHTED_TOKENS: quotas.weighted_tokens_per_minute,
            Dimension.CONCURRENCY: quotas.max_concurrent,
        }
        self.per_minute = {dim: v * fraction for dim, v in limits.items() if v is not None}
        self.max_concurrent: int | None = None
        self.configured_share = grant.at(now)
        self.configured_allowance = grant.allowance_at(now)
        self.buckets: dict[Dimension, TokenBucket] = {
            dim: TokenBucket.full(
                *self._rate_burst(dim, self.configured_share),
                now,
                self._allowance(dim, self.configured_allowance),
            )
            for dim in _RATE_DIMENSIONS
            if dim in self.per_minute
        }
        self.max_concurrent = self._concurrency(self.configured_share)

    def _rate_burst(self, dim: Dimension, share: float) -> tuple[float, float]:
        rate = self.per_minute[dim] * share / 60.0
        return rate, rate * self.settings.burst_seconds

    def _allowance(self, dim: Dimension, fraction: float) -> float:
        """Units of ``dim`` the bucket may lend: a fraction of the pool's minute."""
        return self.per_minute[dim] * self.settings.burst_allowance * max(0.0, fraction)

    def _concurrency(self, share: float) -> int | None:
        pool = self.per_minute.get(Dimension.CONCURRENCY)
        if pool is None:
            return None
        # The burst allowance holds for running requests too: while the pool's other
        # replicas are idle, their slots may run a first burst here — at a share of 0
        # as well (a replica whose first lease claim collided, regional_lb.leases), as
        # its buckets still lend their credit.
        borrowed = self.configured_allowance * self.settings.burst_allowance
        if share <= 0.0 and pool * borrowed <= 0.0:
            return 0
        # Rounded down, but a replica with any share may run one request: otherwise a
        # small share of a small limit would lock the tenant out of this replica. So
        # N replicas together may run up to max_concurrent + N (see README).
        return max(1, math.floor(pool * max(share, borrowed) + 1e-9))

    def inherit(self, previous: _Tenant, now: float) -> None:
        self.in_flight = previous.in_flight
        self.demand = previous.demand
        for dim, bucket in self.buckets.items():
            old = previous.buckets.get(dim)
            if old is not None:
                bucket.level = min(bucket.burst, old.available(now))
                bucket.credit = min(bucket.allowance, old.credit)

    def _sync_share(self, now: float) -> None:
        share = self.grant.at(now)
        allowance = self.grant.allowance_at(now)
        if share == self.configured_share and allowance == self.configured_allowance:
            return
        self.configured_share = share
        self.configured_allowance = allowance
        for dim, bucket in self.buckets.items():
            shut = bucket.burst <= 0.0
            bucket.reconfigure(
                *self._rate_burst(dim, share), now, allowance=self._allowance(dim, allowance)
            )
            if shut and bucket.level >= 0.0:
                # At a share of 0 the replica admitted nothing, so it spent nothing: the
                # share it gets comes with its whole burst, as if it had been configured
                # with it. (A replica whose first claim collides enforces 0 until a claim
                # is verified, regional_lb.leases; keeping the empty level refused the
                # tenant's first requests after the claim with 429s.) A debt it ran up
                # before (a loan, an oversize request) is still owed.
                bucket.level = bucket.burst
        self.max_concurrent = self._concurrency(share)

    def _amounts(self, cost: Cost) -> dict[Dimension, float]:
        weighted = cost.weighted(self.output_weight)
        return {
            Dimension.REQUESTS: 1.0,
            Dimension.INPUT_TOKENS: float(cost.input_tokens),
            Dimension.OUTPUT_TOKENS: float(cost.output_tokens),
            Dimension.WEIGHTED_TOKENS: weighted,
        }

    def admit(
        self, tenant: str, cost: Cost, now: float, settings: QuotaSettings
    ) -> Ticket | Rejection:
        self._sync_share(now)
        amounts = self._amounts(cost)
        units = self.demand.units
        for dim, amount in amounts.items():
            units[dim] = units.get(dim, 0.0) + amount
        self.demand.peak_concurrency = max(self.demand.peak_concurrency, self.in_flight + 1)
        if self.max_concurrent is not None and self.in_flight >= self.max_concurrent:
            return Rejection(
                tenant,
                Dimension.CONCURRENCY,
                1.0,
                f"Too many concurrent requests for tenant {tenant}: limit "
                f"{self.max_concurrent} at this region's replica. Retry when one finishes.",
            )
        worst: tuple[float, Dimension] | None = None
        for dim, bucket in self.buckets.items():
            wait = bucket.wait_for(amounts[dim], now)
            if wait > 0.0 and (worst is None or wait > worst[0]):
                worst = (wait, dim)
        if worst is not None:
            wait, dim = worst
            retry = min(wait, settings.max_retry_after_s)
            limit = self.per_minute[dim] * self.configured_share
            return Rejection(
                tenant,
                dim,
                retry,
                f"Rate limit reached for tenant {tenant} on {dim.value.replace('_', ' ')} "
                f"per minute: limit {limit:.0f} at this region's replica, requested "
                f"{amounts[dim]:.0f}. Please try again in {math.ceil(retry)}s.",
            )
        for dim, bucket in self.buckets.items():
            bucket.take(amounts[dim], now)
        self.in_flight += 1
        return Ticket(tenant, cost, amounts[Dimension.WEIGHTED_TOKENS])

    def finish(self, ticket: Ticket, now: float, *, usage: Usage | None, refund: bool) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        charged = self._amounts(ticket.cost)
        if refund:
            for dim, bucket in self.buckets.items():
                bucket.give_back(charged[dim], now)
            return
        if usage is None:
            return
        actual = self._amounts(Cost(usage.input_tokens, usage.output_tokens))
        for dim, bucket in self.buckets.items():
            delta = actual[dim] - charged[dim]
            if delta > 0.0:
                bucket.take(delta, now)
            elif delta < 0.0:
                bucket.give_back(-delta, now)

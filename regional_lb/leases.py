"""Distributed tenant quotas: Doorman-style capacity leases in the state store.

Several regional LB replicas, in one region or several, draw on one tenant budget
without a central service on the request path. After Google's Doorman (youtube/doorman
``doc/how_it_works.md``, ``doc/algorithms.md``): each replica says what it *wants*, gets
a time-limited share, and refreshes it; shares follow demand; a replica that cannot
reach the store falls back to a configured *safe* share.

Records (:class:`QuotaLeaseRecord`) live at ``keys.quota_lease(tenant, replica)``,
attached to the replica's store lease, so a dead replica's claim disappears with it.
A tenant's budget is split into pools (:func:`regional_lb.quota.pool_of`); shares are
fractions of one pool and the records of one pool must always sum to at most 1.

The store has single-key compare-and-swap but no multi-key transactions, so there is
no master to hand out shares. Instead every replica computes the same max-min fair
division of the pool by the wants in the records (:func:`fair_shares`, with spare
capacity split evenly), and changes its own claim by a *write-then-verify* protocol:

* **shrinking** is immediate: the replica enforces the smaller share first, then
  writes it;
* **growing** is a claim: write the larger share, re-read the pool, and start using it
  only if the records (its own included) sum to at most 1; otherwise write the old share
  back and try again next round. Two replicas growing at once: the one whose verifying
  read comes later sees both claims, so at most the earlier one proceeds (or neither,
  and both retry with the loop's jitter). A replica that gives back a claim before it
  ever had one verified enforces 0 until one is — its record says 0, and others may
  have verified claims counting on that. Its burst allowance still applies at a share of
  0 (:mod:`regional_lb.quota`), so a first burst during that round is not refused.

Each replica's enforced share is therefore at most its record, and every record that
is in use was verified against every earlier one, so the shares in use sum to at most
1 — while the replica holds its lease. It uses its share only until ``t0 + TTL``,
where ``t0`` is when it *sent* its last successful keep-alive: the store cannot have
expired the lease (and freed the record) before that. After it, the safe share.

**Burst allowance.** Each round also sets how much of the pool a replica may admit at
once on credit (:class:`~regional_lb.quota.Grant` ``allowance``, :mod:`regional_lb.quota`):
the whole pool (split among the replicas of its region) while every other replica's
want is at the floor (``min_want``: they are idle, and a burst here borrows budget
nobody uses), else this replica's fair share; what a replica still owes of an earlier
loan counts against it. A
fresh tenant's first burst up to its per-minute quota therefore passes wherever it
arrives; the debt is paid back by the replica's own refill, and its want (the burst is
demand) draws the idle replicas' shares to it within a round or two.

**Bound on over-admission.** Over a window of ``T`` seconds, the replicas of a pool
admit at most

    pool limit × (T + burst_seconds) / 60            every bucket's refill + burst
  + Σ over replicas of the credit they lent           (the burst allowances, below)
  + Σ over replicas of one oversize request's debt   (see regional_lb.buckets)
  + Σ over replicas without a valid lease of safe_share × pool limit × T / 60

Credit is earned back only in quiet time (refill beyond a full bucket), so under
sustained load the second term is spent once and the pool holds its rate; it is the
whole pool only for a replica that bursts while the others look idle, so two replicas
that burst within one round of each other from an idle pool may together exceed the
pool's minute by one pool limit each.

and at most ``max_concurrent + N`` concurrent requests for N replicas (each may run
one). With every replica connected the last term is 0: with the default one-second
burst, a minute's admissions stay within 1/60 ≈ 1.7 % of the quota plus one request
per replica. A replica cut off from the store over-admits by at most its safe share of
the pool (once its record expires, the connected replicas may claim the whole pool, as
they must if it really died); a smaller safe share lowers that bound and the cut-off
replica's throughput alike (``bench/regional.py`` measures both).

**Alone in its pool** (the common case of one regional LB per region, whose pool is
that region's share of the tenant), a replica whose lease runs out keeps the share it
held instead of dropping to the safe share (``keep_share_when_alone``): when the store
is down for everyone — the static-stability case, chaos scenario ``etcd-down`` — nobody
can claim the pool meanwhile, so keeping it over-admits nothing, while the safe share
would refuse half the tenant's traffic for as long as etcd is away. The price is the
rare case where only this replica is cut off *and* a new replica joins the same pool
in that window: the pool is then over-admitted by at most this replica's share until it
reconnects. Set ``keep_share_when_alone=False`` for Doorman's strict behaviour.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field

from gtm.clock import Clock
from gtm.errors import CodecError, LeaseNotFound
from gtm.models import Identifier, NonNegFloat, StoredRecord, UnitFloat
from gtm.state import codec, keys
from gtm.state.store import KeyValue, Lease, StateStore
from regional_lb.errors import LeaseProtocolError
from regional_lb.quota import Demand, Dimension, Grant, Pool, QuotaLimiter

log = logging.getLogger(__name__)

#: Tolerance of the "sum of shares ≤ 1" check: shares are rounded when stored.
_EPS = 1e-9
#: Doorman's "safe capacity" as a share of the pool: right for two replicas per pool (a
#: common HA pair), when a replica cut off from the store then over-admits nothing.
DEFAULT_SAFE_SHARE = 0.5


class QuotaLeaseRecord(StoredRecord):
    """One replica's claim on one tenant pool (a Doorman lease)."""

    tenant: Identifier
    replica: Identifier
    region: Identifier
    pool: Identifier
    #: Fraction of the pool this replica would like (its smoothed demand + headroom).
    want: UnitFloat
    #: Fraction of the pool this replica may use (or is claiming, while it verifies).
    grant: UnitFloat
    updated_at: NonNegFloat = Field(default=0.0)


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Doorman's knobs: lease length, refresh interval, safe capacity."""

    #: Store lease TTL, s. Doorman's typical lease is minutes with a 5 s refresh; ours
    #: is short because it is also how fast a dead replica's share is freed.
    ttl: float = 10.0
    #: Seconds between refreshes (Doorman: "typical refresh interval 5 s"; 1 s makes
    #: shares follow demand within a couple of seconds).
    refresh_interval: float = 1.0
    #: Share used without a valid lease (store down, lease lost, starting up).
    safe_share: float = DEFAULT_SAFE_SHARE
    #: A replica that was alone in its pool at its last round keeps its share when its
    #: lease runs out (see the module docstring for the bound).
    keep_share_when_alone: bool = True
    #: Smallest want, so an idle replica keeps a foothold for its next request.
    min_want: float = 0.02
    #: Wants are demand × headroom, so a growing demand is visible before it is refused.
    headroom: float = 1.25
    #: Weight of the newest demand sample in the moving average (Doorman estimates wants
    #: by a moving average as well).
    ewma_alpha: float = 0.5
    #: A want that moved less than this is not rewritten (saves store writes).
    want_epsilon: float = 0.01

    def __post_init__(self) -> None:
        if not (self.ttl > 0 and self.refresh_interval > 0 and self.refresh_interval < self.ttl):
            raise ValueError("lease ttl and refresh_interval must be > 0, interval < ttl")
        for name in ("safe_share", "min_want", "ewma_alpha"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if not self.headroom >= 1.0:
            raise ValueError("headroom must be >= 1")


def fair_shares(capacity: float, wants: Mapping[str, float]) -> dict[str, float]:
    """Max-min fair division of ``capacity`` by ``wants``; spare capacity split evenly.

    Water-filling: the smallest wants are met in full, the rest share what is left
    equally (Doorman's FAIR_SHARE). When every want is met, what remains is split
    evenly, so a pool never sits idle while a replica could use it. Deterministic (ties
    by id), so every replica computes the same division from the same records.
    """
    if not wants:
        return {}
    ordered = sorted(wants.items(), key=lambda item: (item[1], item[0]))
    remaining = capacity
    shares: dict[str, float] = {}
    for index, (replica, want) in enumerate(ordered):
        share = min(max(0.0, want), remaining / (len(ordered) - index))
        shares[replica] = share
        remaining -= share
    if remaining > _EPS:
        extra = remaining / len(shares)
        shares = {replica: share + extra for replica, share in shares.items()}
    return shares


def demand_fraction(
    demand: Demand, pool_limits: Mapping[Dimension, float], interval_s: float
) -> float:
    """The largest fraction of a pool limit the demand of ``interval_s`` seconds asked for."""
    if interval_s <= 0:
        return 0.0
    fraction = 0.0
    for dim, per_minute in pool_limits.items():
        if per_minute <= 0:
            continue
        if dim is Dimension.CONCURRENCY:
            fraction = max(fraction, demand.peak_concurrency / per_minute)
        else:
            fraction = max(fraction, demand.units.get(dim, 0.0) / (per_minute * interval_s / 60))
    return fraction


@dataclass(slots=True)
class _Holding:
    """This replica's claim on one tenant pool."""

    pool: Pool
    #: Share the limiter enforces while the lease is valid.
    in_use: float
    #: Whether ``in_use`` is verified in the store under our current lease.
    backed: bool = False
    want: float = 0.0
    smoothed: float = 0.0
    #: The last (want, grant) we wrote under our current lease.
    written: tuple[float, float] | None = None
    #: Whether no other replica held a record in the pool at our last round.
    alone: bool = False
    #: Fraction of the pool this replica may admit at once on credit (module docstring).
    allowance: float = 1.0


class CapacityLeases:
    """This replica's capacity leases for every tenant with quotas; the I/O edge.

    Call :meth:`refresh` periodically (``run_loop`` under a TaskSupervisor) — every
    round keeps the store lease alive, then re-divides each tenant's pool. Failures
    propagate (the loop retries with backoff); the limiter's grants expire on their own.
    """

    def __init__(
        self,
        store: StateStore,
        limiter: QuotaLimiter,
        *,
        replica_id: str,
        region: str,
        clock: Clock,
        registry: CollectorRegistry,
        settings: LeaseSettings | None = None,
    ) -> None:
        self._store = store
        self._limiter = limiter
        self._replica = replica_id
        self._region = region
        self._clock = clock
        self._settings = settings or LeaseSettings()
        self._lease: Lease | None = None
        self._valid_until = -math.inf
        self._holdings: dict[str, _Holding] = {}
        self._last_round = clock.monotonic()
        self._m_share = Gauge(
            "gtm_regional_quota_lease_share",
            "Fraction of the tenant's pool this replica enforces now.",
            ["tenant"],
            registry=registry,
        )
        self._m_want = Gauge(
            "gtm_regional_quota_lease_want",
            "Fraction of the tenant's pool this replica asks for.",
            ["tenant"],
            registry=registry,
        )
        self._m_conflicts = Counter(
            "gtm_regional_quota_lease_conflicts_total",
            "Share increases given back because the pool was over-claimed.",
            ["tenant"],
            registry=registry,
        )
        self._m_safe = Gauge(
            "gtm_regional_quota_safe_mode",
            "1 while this replica has no valid capacity lease and enforces safe shares.",
            registry=registry,
        )
        self._m_safe.set_function(lambda: 0.0 if self.lease_valid() else 1.0)

    @property
    def settings(self) -> LeaseSettings:
        return self._settings

    def lease_valid(self) -> bool:
        return self._clock.monotonic() < self._valid_until

    def share(self, tenant: str) -> float:
        """The share of ``tenant``'s pool in force now (the limiter's view)."""
        return self._limiter.share(tenant, self._clock.monotonic())

    def holdings(self) -> Mapping[str, tuple[float, bool]]:
        """Tenant → (share in use, verified in the store)."""
        return {t: (h.in_use, h.backed) for t, h in self._holdings.items()}

    # ------------------------------------------------------------------ configuration

    def configure(self, pools: Mapping[str, Pool]) -> None:
        """The tenants (with quotas) this replica meters, and their pools here.

        A new tenant starts on the safe share, unverified, until its first round: traffic
        is never blocked waiting for the store (static stability).
        """
        for tenant in list(self._holdings):
            if tenant not in pools:
                del self._holdings[tenant]
                self._m_share.remove(tenant)
                self._m_want.remove(tenant)
        for tenant, pool in pools.items():
            holding = self._holdings.get(tenant)
            if holding is None or holding.pool != pool:
                holding = _Holding(pool, in_use=self._settings.safe_share)
                self._holdings[tenant] = holding
            self._push(tenant, holding)

    def _fallback(self, holding: _Holding) -> float:
        """The share enforced once the lease runs out without a refresh."""
        safe = self._settings.safe_share
        if holding.alone and self._settings.keep_share_when_alone:
            return max(safe, holding.in_use)
        return safe

    def _push(self, tenant: str, holding: _Holding) -> None:
        if holding.backed:
            grant = Grant(
                holding.in_use, self._valid_until, self._fallback(holding), holding.allowance
            )
        else:
            grant = Grant(holding.in_use, math.inf, holding.in_use, holding.allowance)
        self._limiter.set_grant(tenant, grant)
        self._m_share.labels(tenant).set_function(lambda: self.share(tenant))
        self._m_want.labels(tenant).set(holding.want)

    # ------------------------------------------------------------------ rounds

    async def refresh(self) -> None:
        """One round: keep the store lease alive (or get a new one), then every tenant."""
        now = self._clock.monotonic()
        # At least one interval: back-to-back rounds (after a retry) would otherwise
        # turn a handful of requests into a huge rate.
        interval = max(now - self._last_round, self._settings.refresh_interval)
        self._last_round = now
        await self._keep_lease(now)
        for tenant in sorted(self._holdings):
            await self._refresh_tenant(tenant, interval)

    async def _keep_lease(self, now: float) -> None:
        if self._lease is not None:
            try:
                ttl = await self._store.keep_alive(self._lease.id)
            except LeaseNotFound:
                log.warning(
                    "capacity lease %#x expired; falling back to safe shares", self._lease.id
                )
                self._lease = None
                self._lose_backing()
            else:
                self._valid_until = now + ttl
                return
        self._lease = await self._store.grant_lease(self._settings.ttl)
        self._valid_until = now + self._lease.ttl

    def _lose_backing(self) -> None:
        """Our records are gone with the lease: enforce safe shares, claim again."""
        self._valid_until = -math.inf
        for tenant, holding in self._holdings.items():
            holding.backed = False
            holding.written = None
            holding.alone = False  # others may have claimed the pool while we were away
            holding.in_use = self._settings.safe_share
            self._push(tenant, holding)

    async def close(self) -> None:
        """Give every claim back (revoke the lease) so peers can use it at once."""
        lease, self._lease = self._lease, None
        self._lose_backing()
        if lease is not None:
            await self._store.revoke_lease(lease.id)

    # ------------------------------------------------------------------ one tenant

    async def _pool_records(self, tenant: str, pool: str) -> tuple[list[QuotaLeaseRecord], int]:
        """Every record of ``tenant``'s ``pool`` and the listing's revision."""
        listing = await self._store.range(keys.prefix(keys.Kind.QUOTA_LEASE, tenant))
        records = [r for r in map(self._decode, listing.kvs) if r is not None and r.pool == pool]
        return records, listing.revision

    @staticmethod
    def _decode(kv: KeyValue) -> QuotaLeaseRecord | None:
        try:
            return codec.decode(kv.key, kv.value, QuotaLeaseRecord)
        except CodecError as exc:
            log.warning("ignoring quota lease record: %s", exc)
            return None

    def _update_want(self, tenant: str, holding: _Holding, interval: float) -> float:
        settings = self._settings
        demand = self._limiter.take_demand(tenant)
        # Capped at the whole pool: a want cannot exceed 1, and an uncapped spike would
        # take many rounds to decay out of the average.
        sample = min(1.0, demand_fraction(demand, self._limiter.pool_limits(tenant), interval))
        alpha = settings.ewma_alpha
        holding.smoothed = alpha * sample + (1 - alpha) * holding.smoothed
        want = min(1.0, max(settings.min_want, holding.smoothed * settings.headroom))
        if holding.written is None or abs(want - holding.written[0]) >= settings.want_epsilon:
            holding.want = round(want, 6)
        else:
            holding.want = holding.written[0]
        return holding.want

    async def _refresh_tenant(self, tenant: str, interval: float) -> None:
        holding = self._holdings[tenant]
        pool = holding.pool.id
        records, _ = await self._pool_records(tenant, pool)
        others = [r for r in records if r.replica != self._replica]
        mine = next((r for r in records if r.replica == self._replica), None)
        holding.alone = not others
        if holding.backed and mine is None:
            # Someone removed our record: what we use is no longer accounted for.
            holding.backed = False
            holding.written = None
            holding.in_use = min(holding.in_use, self._settings.safe_share)
        want = self._update_want(tenant, holding, interval)
        if mine is not None and holding.written is None and mine.want > want:
            # Demand history: our record from before a restart (still held by the old
            # lease) says what this pool asked of us; start there, not from idle.
            holding.smoothed = max(holding.smoothed, mine.want / self._settings.headroom)
            want = holding.want = mine.want
        ideal = self._divide(holding, others, want)
        claimed = math.fsum(r.grant for r in others)
        target = round(max(0.0, min(ideal, 1.0 - claimed)), 6)
        if holding.backed and target <= holding.in_use:
            await self._shrink(tenant, holding, target)
        else:
            await self._grow(tenant, holding, target)

    def _divide(self, holding: _Holding, others: Sequence[QuotaLeaseRecord], want: float) -> float:
        """Our fair share of the pool by the wants on record; sets our burst allowance."""
        wants = {r.replica: r.want for r in others}
        wants[self._replica] = want
        ideal = fair_shares(1.0, wants)[self._replica]
        busy = any(r.want > self._settings.min_want + _EPS for r in others)
        # Replicas of one region split the region's allowance (an HA pair shares its
        # load, so both would burst at once).
        here = 1 + sum(1 for r in others if r.region == self._region)
        holding.allowance = ideal if busy else 1.0 / here
        return ideal

    async def _shrink(self, tenant: str, holding: _Holding, target: float) -> None:
        holding.in_use = target  # enforce first, then tell the others
        self._push(tenant, holding)
        await self._write(tenant, holding, target)

    async def _grow(self, tenant: str, holding: _Holding, target: float) -> None:
        if not holding.backed and target < holding.in_use:
            holding.in_use = target
            self._push(tenant, holding)
        await self._write(tenant, holding, target)
        records, _ = await self._pool_records(tenant, holding.pool.id)
        mine = next((r for r in records if r.replica == self._replica), None)
        total = math.fsum(r.grant for r in records)
        if mine is not None and mine.grant == target and total <= 1.0 + _EPS:
            holding.in_use = target
            holding.backed = True
            self._push(tenant, holding)
            return
        self._m_conflicts.labels(tenant).inc()
        if not holding.backed:
            # Our record will say 0 and another replica may have verified a claim that
            # counts on it; still using the unrecorded safe share would over-allocate the
            # pool (two replicas starting together: one verified at 1.0, the other on 0.3).
            # Enforce a share of 0 until a round verifies a claim — with each other's
            # wants known, the next round's fair shares no longer collide. A share of 0
            # still lends its burst allowance (regional_lb.quota), so a first burst in
            # this window is not refused; the allowance is re-derived from the pool as
            # this read saw it (the replicas we collided with are on record now).
            self._divide(holding, [r for r in records if r.replica != self._replica], holding.want)
            holding.in_use = 0.0
            self._push(tenant, holding)
        log.info(
            "tenant %s pool %s over-claimed (%.3f); giving back our claim of %.3f",
            tenant,
            holding.pool.id,
            total,
            target,
        )
        await self._write(tenant, holding, holding.in_use if holding.backed else 0.0)

    async def _write(self, tenant: str, holding: _Holding, grant: float) -> None:
        if holding.written == (holding.want, grant):
            return
        lease = self._lease
        if lease is None:
            raise LeaseProtocolError("no capacity lease held while writing a claim")
        record = QuotaLeaseRecord(
            tenant=tenant,
            replica=self._replica,
            region=self._region,
            pool=holding.pool.id,
            want=holding.want,
            grant=grant,
            updated_at=self._clock.wall(),
        )
        await self._store.put(
            keys.quota_lease(tenant, self._replica), codec.encode(record), lease=lease.id
        )
        holding.written = (holding.want, grant)


def pool_totals(records: Sequence[QuotaLeaseRecord]) -> dict[tuple[str, str], float]:
    """(tenant, pool) → sum of the grants in ``records`` (for tests and ``gtm state``)."""
    totals: dict[tuple[str, str], float] = {}
    for record in records:
        key = (record.tenant, record.pool)
        totals[key] = totals.get(key, 0.0) + record.grant
    return totals

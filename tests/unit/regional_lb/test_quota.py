from __future__ import annotations

import math

import pytest

from regional_lb.quota import (
    UNLISTED_POOL,
    Cost,
    Dimension,
    Grant,
    Pool,
    QuotaLimiter,
    QuotaSettings,
    Rejection,
    Ticket,
    Usage,
    pool_of,
)
from tests.unit.regional_lb.helpers import quotas, tenant

FULL = Grant(1.0, math.inf, 1.0)


def limiter_with(
    share: Grant = FULL, fraction: float = 1.0, allowance: float = 0.0, **limits: float
) -> QuotaLimiter:
    """A limiter for tenant t1; strict per-second quantisation unless ``allowance``."""
    limiter = QuotaLimiter(QuotaSettings(burst_seconds=1.0, burst_allowance=allowance))
    limiter.configure("t1", quotas(**limits), fraction, share, now=0.0)
    return limiter


def admitted(result: Ticket | Rejection) -> Ticket:
    assert isinstance(result, Ticket), result
    return result


def rejected(result: Ticket | Rejection) -> Rejection:
    assert isinstance(result, Rejection), result
    return result


def test_requests_per_minute_is_a_per_second_rate_with_a_one_second_burst() -> None:
    limiter = limiter_with(requests_per_minute=600)  # 10/s, burst 10
    for _ in range(10):
        admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    refusal = rejected(limiter.admit("t1", Cost(1, 1), 0.0))
    assert refusal.reason is Dimension.REQUESTS
    assert refusal.retry_after_s == pytest.approx(0.1)
    assert "requests per minute" in refusal.message
    admitted(limiter.admit("t1", Cost(1, 1), 0.1))


def test_sixty_seconds_of_overload_admit_at_most_a_minute_plus_the_burst() -> None:
    limiter = limiter_with(requests_per_minute=600)
    count = 0
    for step in range(6000):  # 60 s in 10 ms steps, 10x the allowed rate
        now = step * 0.01
        if isinstance(limiter.admit("t1", Cost(10, 10), now), Ticket):
            count += 1
    assert 600 <= count <= 600 + 10


def test_weighted_tokens_count_output_with_its_weight() -> None:
    # 60,000 weighted tokens a minute = 1,000/s; output weight 4.
    limiter = limiter_with(weighted_tokens_per_minute=60_000, output_weight=4)
    admitted(limiter.admit("t1", Cost(200, 200), 0.0))  # 200 + 800 = 1000: the burst
    refusal = rejected(limiter.admit("t1", Cost(1, 0), 0.0))
    assert refusal.reason is Dimension.WEIGHTED_TOKENS


def test_input_and_output_token_limits_are_separate() -> None:
    limiter = limiter_with(input_tokens_per_minute=6_000, output_tokens_per_minute=600)
    refusal = rejected(
        limiter.admit("t1", Cost(10, 10), 0.0) and limiter.admit("t1", Cost(10, 10), 0.0)
    )
    assert refusal.reason is Dimension.OUTPUT_TOKENS


def test_concurrency_limit_and_release() -> None:
    limiter = limiter_with(max_concurrent=2)
    first = admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    refusal = rejected(limiter.admit("t1", Cost(1, 1), 0.0))
    assert refusal.reason is Dimension.CONCURRENCY
    assert refusal.retry_after_s == 1.0
    limiter.finish(first, 0.0)
    limiter.finish(first, 0.0)  # twice: no effect
    assert limiter.in_flight("t1") == 1
    admitted(limiter.admit("t1", Cost(1, 1), 0.0))


def test_reconcile_charges_actual_output_and_refunds_overestimates() -> None:
    limiter = limiter_with(output_tokens_per_minute=6_000)  # 100/s, burst 100
    ticket = admitted(limiter.admit("t1", Cost(1, 100), 0.0))
    limiter.finish(ticket, 0.0, usage=Usage(1, 10))  # used 10 of the 100 charged
    for _ in range(9):
        admitted(limiter.admit("t1", Cost(1, 10), 0.0))
    rejected(limiter.admit("t1", Cost(1, 10), 0.0))
    # Under-estimates are charged afterwards (a debt).
    ticket = admitted(limiter.admit("t1", Cost(1, 10), 1.0))
    limiter.finish(ticket, 1.0, usage=Usage(1, 500))
    assert rejected(limiter.admit("t1", Cost(1, 10), 1.0)).retry_after_s > 4.0


def test_refund_gives_everything_back() -> None:
    limiter = limiter_with(requests_per_minute=60, max_concurrent=1)  # burst of 1
    ticket = admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    limiter.finish(ticket, 0.0, refund=True)
    admitted(limiter.admit("t1", Cost(1, 1), 0.0))


def test_share_scales_every_limit_and_expires_to_the_fallback() -> None:
    grant = Grant(share=0.5, valid_until=10.0, fallback=0.1)
    limiter = limiter_with(grant, requests_per_minute=1200, max_concurrent=10)
    assert limiter.limits("t1", 0.0) == {Dimension.REQUESTS: 600, Dimension.CONCURRENCY: 5}
    assert limiter.limits("t1", 10.0) == {
        Dimension.REQUESTS: pytest.approx(120),
        Dimension.CONCURRENCY: pytest.approx(1),
    }
    tickets = [admitted(limiter.admit("t1", Cost(1, 1), 0.0)) for _ in range(5)]
    assert rejected(limiter.admit("t1", Cost(1, 1), 0.0)).reason is Dimension.CONCURRENCY
    for ticket in tickets:
        limiter.finish(ticket, 0.0)
    for _ in range(5):  # the rest of the burst of 10 at share 0.5 (20/s x 0.5)
        limiter.finish(admitted(limiter.admit("t1", Cost(1, 1), 0.0)), 0.0)
    assert rejected(limiter.admit("t1", Cost(1, 1), 0.0)).reason is Dimension.REQUESTS


def test_a_tiny_share_still_runs_one_request_at_a_time() -> None:
    limiter = limiter_with(Grant(0.01, math.inf, 0.01), max_concurrent=10)
    ticket = admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    rejected(limiter.admit("t1", Cost(1, 1), 0.0))
    limiter.finish(ticket, 0.0)


def test_zero_share_refuses_with_a_bounded_retry_after() -> None:
    limiter = limiter_with(Grant(0.0, math.inf, 0.0), requests_per_minute=60)
    refusal = rejected(limiter.admit("t1", Cost(1, 1), 0.0))
    assert refusal.retry_after_s == 60.0


def test_pool_fraction_scales_limits() -> None:
    limiter = limiter_with(fraction=0.25, requests_per_minute=400)
    assert limiter.pool_limits("t1") == {Dimension.REQUESTS: 100}


def test_unknown_tenants_are_unmetered() -> None:
    limiter = QuotaLimiter()
    ticket = admitted(limiter.admit("nobody", Cost(1, 1), 0.0))
    limiter.finish(ticket, 0.0)
    assert limiter.share("nobody", 0.0) == 0.0
    assert limiter.limits("nobody", 0.0) == {}


def test_reconfigure_keeps_levels_and_in_flight() -> None:
    limiter = limiter_with(requests_per_minute=600, max_concurrent=50)
    for _ in range(10):
        admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    limiter.set_grant("t1", Grant(0.5, math.inf, 0.5))
    limiter.configure("t1", quotas(requests_per_minute=1200), 1.0, FULL, 0.0)
    assert limiter.share("t1", 0.0) == 0.5  # the lease share in force is kept
    assert limiter.in_flight("t1") == 10  # open tickets survive...
    rejected(limiter.admit("t1", Cost(1, 1), 0.0))  # ...and the bucket was not refilled


def test_demand_counts_rejected_requests_too() -> None:
    limiter = limiter_with(requests_per_minute=60)
    for _ in range(5):
        limiter.admit("t1", Cost(10, 20), 0.0)
    demand = limiter.take_demand("t1")
    assert demand.units[Dimension.REQUESTS] == 5
    assert demand.units[Dimension.INPUT_TOKENS] == 50
    assert limiter.take_demand("t1").units == {}


def test_pools_follow_regional_shares() -> None:
    listed = tenant(shares={"eu-west": 0.5, "eu-central": 0.3})
    assert pool_of(listed, "eu-west") == Pool("eu-west", 0.5)
    assert pool_of(listed, "us-east").id == UNLISTED_POOL
    assert pool_of(listed, "us-east").fraction == pytest.approx(0.2)
    assert pool_of(tenant(), "us-east") == Pool(UNLISTED_POOL, 1.0)


def test_a_share_granted_after_a_share_of_0_comes_with_its_burst() -> None:
    # A replica whose first lease claim collided enforces 0 until a claim is verified
    # (regional_lb.leases); it admitted nothing meanwhile, so it has spent nothing.
    limiter = limiter_with(Grant(0.0, math.inf, 0.0), requests_per_minute=600)
    rejected(limiter.admit("t1", Cost(1, 1), 0.0))
    limiter.set_grant("t1", FULL)
    # The whole burst of the new share (10/s x 1 s), at once, then the rate.
    for _ in range(10):
        admitted(limiter.admit("t1", Cost(1, 1), 0.5))
    rejected(limiter.admit("t1", Cost(1, 1), 0.5))


def test_a_share_that_grows_from_a_spent_bucket_does_not_refill_it() -> None:
    limiter = limiter_with(Grant(0.5, math.inf, 0.5), requests_per_minute=1200)
    for _ in range(10):  # the burst at share 0.5: 20/s x 0.5 x 1 s
        admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    limiter.set_grant("t1", FULL)
    rejected(limiter.admit("t1", Cost(1, 1), 0.0))


SIXTH = Grant(1 / 6, math.inf, 1 / 6)


def test_a_fresh_tenants_first_burst_passes_up_to_its_per_minute_quota() -> None:
    """A sixth of 60/min is 1/6 of a request a second; the allowance lends the pool's
    minute, so the first 60 pass, and the debt is then paid at the share's rate."""
    limiter = QuotaLimiter()  # the default settings: burst allowance 1.0
    limiter.configure("t1", quotas(requests_per_minute=60), 1.0, SIXTH, 0.0)
    for _ in range(60):
        admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    # The first was the share's own second (1/6 of a request), 59 were lent: one more.
    assert limiter.credit("t1", 0.0)[Dimension.REQUESTS] == pytest.approx(1)
    admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    refusal = rejected(limiter.admit("t1", Cost(1, 1), 0.0))
    assert refusal.retry_after_s == 60.0  # 6 minutes of debt, capped
    # Ten minutes of overload admit the debt's worth less: the burst was a loan.
    count = sum(
        isinstance(limiter.admit("t1", Cost(1, 1), step * 0.1), Ticket) for step in range(6000)
    )
    assert count <= 10 * 10 - 60 + 1


def test_the_grant_scales_the_allowance() -> None:
    limiter = QuotaLimiter()
    busy = Grant(1 / 6, math.inf, 1 / 6, allowance=1 / 6)  # other regions show demand
    limiter.configure("t1", quotas(requests_per_minute=60), 1.0, busy, 0.0)
    assert limiter.credit("t1", 0.0) == {Dimension.REQUESTS: pytest.approx(10)}
    limiter.set_grant("t1", SIXTH)  # they went quiet: the allowance grows, credit does not
    assert limiter.credit("t1", 0.0) == {Dimension.REQUESTS: pytest.approx(10)}
    limiter.set_grant("t1", Grant(1 / 6, math.inf, 1 / 6, allowance=0.05))
    admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    assert limiter.credit("t1", 0.0) == {Dimension.REQUESTS: pytest.approx(3)}


def test_a_policy_reload_keeps_the_credit_spent() -> None:
    limiter = QuotaLimiter()
    limiter.configure("t1", quotas(requests_per_minute=60), 1.0, SIXTH, 0.0)
    for _ in range(30):
        admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    limiter.configure("t1", quotas(requests_per_minute=120), 1.0, SIXTH, 0.0)
    assert limiter.credit("t1", 0.0)[Dimension.REQUESTS] == 60 - 29  # the first was its own


def test_burst_allowance_is_checked() -> None:
    with pytest.raises(ValueError, match="burst_allowance"):
        QuotaSettings(burst_allowance=-0.5)


def test_a_first_burst_may_run_up_to_the_pools_concurrency() -> None:
    limiter = QuotaLimiter()
    limiter.configure("t1", quotas(max_concurrent=64), 1.0, SIXTH, 0.0)
    tickets = [admitted(limiter.admit("t1", Cost(1, 1), 0.0)) for _ in range(64)]
    assert rejected(limiter.admit("t1", Cost(1, 1), 0.0)).reason is Dimension.CONCURRENCY
    # Once the other regions show demand, the allowance is the fair share again.
    limiter.set_grant("t1", Grant(1 / 6, math.inf, 1 / 6, allowance=1 / 6))
    for ticket in tickets[:54]:
        limiter.finish(ticket, 0.0)
    assert rejected(limiter.admit("t1", Cost(1, 1), 0.0)).reason is Dimension.CONCURRENCY


def test_a_debt_outlives_a_share_of_0() -> None:
    limiter = QuotaLimiter()
    limiter.configure("t1", quotas(requests_per_minute=60), 1.0, SIXTH, 0.0)
    for _ in range(61):
        admitted(limiter.admit("t1", Cost(1, 1), 0.0))
    limiter.set_grant("t1", Grant(0.0, math.inf, 0.0))
    rejected(limiter.admit("t1", Cost(1, 1), 1.0))
    limiter.set_grant("t1", SIXTH)
    rejected(limiter.admit("t1", Cost(1, 1), 2.0))  # still paying the loan back


def test_without_a_valid_lease_the_allowance_is_at_most_the_fallback() -> None:
    grant = Grant(0.5, valid_until=10.0, fallback=0.25, allowance=1.0)
    assert (grant.allowance_at(0.0), grant.allowance_at(10.0)) == (1.0, 0.25)

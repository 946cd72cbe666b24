from __future__ import annotations

import math

import pytest

from regional_lb.buckets import TokenBucket


def test_full_bucket_admits_its_burst_then_waits_for_refill() -> None:
    bucket = TokenBucket.full(rate=2.0, burst=4.0, now=0.0)
    for _ in range(4):
        assert bucket.wait_for(1, 0.0) == 0.0
        bucket.take(1, 0.0)
    assert bucket.wait_for(1, 0.0) == pytest.approx(0.5)
    assert bucket.wait_for(1, 0.5) == 0.0


def test_refill_never_exceeds_the_burst() -> None:
    bucket = TokenBucket.full(rate=10.0, burst=3.0, now=0.0)
    bucket.take(3, 0.0)
    assert bucket.available(100.0) == 3.0


def test_oversize_request_needs_a_full_bucket_and_leaves_a_debt() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=5.0, now=0.0)
    bucket.take(1, 0.0)
    assert bucket.wait_for(50, 0.0) == pytest.approx(1.0)  # until the bucket is full
    assert bucket.wait_for(50, 1.0) == 0.0
    bucket.take(50, 1.0)
    assert bucket.available(1.0) == -45.0
    assert bucket.wait_for(1, 1.0) == pytest.approx(46.0)


def test_admissions_over_a_window_stay_within_burst_plus_refill() -> None:
    rate, burst, horizon = 5.0, 5.0, 60.0
    bucket = TokenBucket.full(rate, burst, now=0.0)
    admitted = 0
    t = 0.0
    while t < horizon:
        while bucket.wait_for(1, t) == 0.0:
            bucket.take(1, t)
            admitted += 1
        t += 0.01
    assert admitted <= burst + rate * horizon
    assert admitted >= rate * horizon  # and nothing is wasted


def test_zero_rate_never_admits() -> None:
    bucket = TokenBucket.full(rate=0.0, burst=0.0, now=0.0)
    assert bucket.wait_for(1, 10.0) == math.inf


def test_give_back_is_capped_at_the_burst() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=2.0, now=0.0)
    bucket.take(1, 0.0)
    bucket.give_back(10, 0.0)
    assert bucket.available(0.0) == 2.0


def test_reconfigure_keeps_the_level_but_caps_it() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=10.0, now=0.0)
    bucket.take(2, 0.0)
    bucket.reconfigure(rate=0.5, burst=4.0, now=0.0)
    assert bucket.available(0.0) == 4.0
    bucket.reconfigure(rate=2.0, burst=20.0, now=0.0)
    assert bucket.available(0.0) == 4.0
    assert bucket.available(1.0) == 6.0


@pytest.mark.parametrize(("rate", "burst"), [(-1.0, 1.0), (1.0, math.inf), (math.nan, 1.0)])
def test_invalid_parameters_are_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="finite rate and burst"):
        TokenBucket.full(rate, burst, 0.0)


def test_credit_lends_a_burst_whose_debt_is_paid_before_anything_else() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=1.0, now=0.0, allowance=59.0)
    for _ in range(60):  # its own burst of 1, then 59 on credit
        assert bucket.wait_for(1, 0.0) == 0.0
        bucket.take(1, 0.0)
    assert bucket.credit == 0.0
    assert bucket.available(0.0) == -59.0
    # The debt is paid back by refill before the next admission: 60 s at 1/s.
    assert bucket.wait_for(1, 0.0) == pytest.approx(60.0)
    assert bucket.wait_for(1, 59.9) > 0.0
    assert bucket.wait_for(1, 60.0) == 0.0


def test_credit_is_earned_back_only_by_refill_beyond_a_full_bucket() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=1.0, now=0.0, allowance=10.0)
    for _ in range(11):
        bucket.take(1, 0.0)
    assert bucket.available(10.0) == 0.0  # 10 s repaid the debt: no credit yet
    assert bucket.credit == 0.0
    assert bucket.available(16.0) == 1.0  # full after 1 s, then 5 s of overflow
    assert bucket.credit == 5.0
    assert bucket.available(1000.0) == 1.0
    assert bucket.credit == 10.0  # capped at the allowance


def test_credit_admits_at_most_burst_plus_allowance_plus_refill_over_a_window() -> None:
    rate, burst, allowance, horizon = 1.0, 1.0, 60.0, 120.0
    bucket = TokenBucket.full(rate, burst, now=0.0, allowance=allowance)
    admitted, t = 0, 0.0
    while t < horizon:
        while bucket.wait_for(1, t) == 0.0:
            bucket.take(1, t)
            admitted += 1
        t += 0.01
    assert admitted <= burst + allowance + rate * horizon
    # Sustained demand earns no credit back (beyond the rounding of 10 ms steps).
    assert bucket.credit < 0.1


def test_a_refund_pays_the_debt_first_then_restores_credit() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=1.0, now=0.0, allowance=5.0)
    for _ in range(6):
        bucket.take(1, 0.0)
    bucket.give_back(6, 0.0)  # none of them ran: the debt is paid, the credit still lent
    assert (bucket.available(0.0), bucket.credit) == (1.0, 0.0)
    bucket.give_back(3, 0.0)  # beyond a full bucket: credit, never level
    assert (bucket.available(0.0), bucket.credit) == (1.0, 3.0)


def test_an_empty_share_admits_on_credit_alone() -> None:
    # A share of 0 (a lease claim that collided) still lends its allowance, once: no
    # rate refills it, so after the credit nothing more is admitted, ever.
    bucket = TokenBucket.full(rate=0.0, burst=0.0, now=0.0, allowance=3.0)
    for _ in range(3):
        assert bucket.wait_for(1, 0.0) == 0.0
        bucket.take(1, 0.0)
    assert (bucket.available(0.0), bucket.credit) == (-3.0, 0.0)
    assert bucket.wait_for(1, 1000.0) == math.inf


def test_reconfigure_caps_the_credit_and_never_adds_to_it() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=1.0, now=0.0, allowance=30.0)
    bucket.reconfigure(1.0, 1.0, 0.0, allowance=10.0)
    assert bucket.credit == 10.0
    bucket.reconfigure(1.0, 1.0, 0.0, allowance=60.0)
    assert bucket.credit == 10.0
    with pytest.raises(ValueError, match="finite rate and burst"):
        bucket.reconfigure(1.0, 1.0, 0.0, allowance=-1.0)

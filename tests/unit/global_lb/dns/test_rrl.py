from __future__ import annotations

import ipaddress

from global_lb.dns.rrl import ResponseRateLimiter, RrlAction, RrlConfig
from gtm.clock import FakeClock


def test_limit_per_prefix_with_slip_and_refill() -> None:
    clock = FakeClock()
    rrl = ResponseRateLimiter(RrlConfig(rate=5, slip=2), clock)
    a, same_prefix, other = (
        ipaddress.ip_address(x) for x in ("192.0.2.1", "192.0.2.77", "198.51.100.1")
    )
    assert [rrl.check(a) for _ in range(5)] == [RrlAction.ANSWER] * 5
    assert [rrl.check(same_prefix) for _ in range(4)] == [RrlAction.DROP, RrlAction.SLIP] * 2
    assert rrl.check(other) is RrlAction.ANSWER
    clock.advance_nowait(0.2)  # one token back
    assert rrl.check(a) is RrlAction.ANSWER
    assert rrl.check(a) is not RrlAction.ANSWER


def test_ipv6_prefix_is_56_and_zero_rate_disables() -> None:
    clock = FakeClock()
    rrl = ResponseRateLimiter(RrlConfig(rate=1, slip=0), clock)
    x, y, z = (
        ipaddress.ip_address(v) for v in ("2001:db8:0:1::1", "2001:db8:0:ff::1", "2001:db8:1::1")
    )
    assert rrl.check(x) is RrlAction.ANSWER
    assert rrl.check(y) is RrlAction.DROP  # same /56, slip 0: never slips
    assert rrl.check(z) is RrlAction.ANSWER
    off = ResponseRateLimiter(RrlConfig(rate=0), clock)
    assert not off.enabled
    assert all(off.check(x) is RrlAction.ANSWER for _ in range(100))

"""The announcement policy: residency first, then stopping, health, servability, drain."""

from __future__ import annotations

import ipaddress

import pytest

from global_lb.anycast.policy import (
    Announcement,
    AnycastPrefix,
    DrainBehaviour,
    DrainPolicy,
    RegionSignals,
    Service,
    decide,
    decide_one,
)

FRONT = AnycastPrefix(ipaddress.ip_network("198.51.100.0/24"))
DNS6 = AnycastPrefix(ipaddress.ip_network("2001:db8:53::/48"), Service.DNS)
EU = AnycastPrefix(ipaddress.ip_network("203.0.113.0/24"), jurisdiction="eu")
BOTH = frozenset({Service.FRONT_DOOR, Service.DNS})


def signals(**changes: object) -> RegionSignals:
    base: dict[str, object] = {
        "region": "westeurope",
        "jurisdictions": frozenset({"eu", "nl"}),
        "ready": BOTH,
        "servable": frozenset({"eu", "nl", "us"}),
    }
    base.update(changes)
    return RegionSignals(**base)  # type: ignore[arg-type]


DEFAULT_DRAIN = DrainPolicy()


def state(prefix: AnycastPrefix, sig: RegionSignals, drain: DrainPolicy = DEFAULT_DRAIN) -> str:
    return decide_one(prefix, sig, drain).announcement


def test_a_ready_region_announces_every_prefix_it_may() -> None:
    plan = decide((FRONT, DNS6, EU), signals(), DrainPolicy())
    assert [d.announcement for d in plan.decisions] == [Announcement.ANNOUNCE] * 3
    assert plan.by_prefix[EU.network].reason == "ready"


def test_a_residency_bound_prefix_is_withdrawn_outside_its_jurisdiction() -> None:
    us = signals(region="eastus", jurisdictions=frozenset({"us"}))
    assert state(EU, us) is Announcement.WITHDRAW
    assert state(FRONT, us) is Announcement.ANNOUNCE
    assert decide_one(EU, us, DrainPolicy()).reason == "outside jurisdiction eu"


@pytest.mark.parametrize("behaviour", list(DrainBehaviour))
def test_residency_wins_over_draining_and_the_store_outage(behaviour: DrainBehaviour) -> None:
    us = signals(
        jurisdictions=frozenset({"us"}), draining=True, store_reachable=False, servable=None
    )
    assert state(EU, us, DrainPolicy(behaviour=behaviour)) is Announcement.WITHDRAW


def test_a_service_that_is_not_ready_withdraws_only_its_own_prefixes() -> None:
    sig = signals(ready=frozenset({Service.DNS}))
    assert state(FRONT, sig) is Announcement.WITHDRAW
    assert state(DNS6, sig) is Announcement.ANNOUNCE
    assert decide_one(FRONT, sig, DrainPolicy()).reason == "front-door not ready"


def test_stopping_withdraws_everything() -> None:
    plan = decide((FRONT, DNS6, EU), signals(stopping=True), DrainPolicy())
    assert plan.announced() == ()


def test_an_etcd_outage_alone_never_withdraws() -> None:
    # The last view says nothing is servable (stale), the store is down: keep announcing.
    sig = signals(store_reachable=False, servable=frozenset(), any_available=False)
    assert state(FRONT, sig) is Announcement.ANNOUNCE
    assert state(EU, sig) is Announcement.ANNOUNCE
    assert "static stability" in decide_one(FRONT, sig, DrainPolicy()).reason


def test_a_prefix_whose_names_no_region_can_serve_is_withdrawn() -> None:
    no_eu = signals(servable=frozenset({"us"}))
    assert state(EU, no_eu) is Announcement.WITHDRAW
    assert state(FRONT, no_eu) is Announcement.ANNOUNCE
    nothing = signals(servable=frozenset(), any_available=False)
    assert state(FRONT, nothing) is Announcement.WITHDRAW


def test_no_view_yet_skips_the_servability_check() -> None:
    assert state(EU, signals(servable=None, any_available=False)) is Announcement.ANNOUNCE


def test_a_drain_announces_draining_then_withdraws_after_the_grace() -> None:
    drain = DrainPolicy(grace_s=30.0)
    assert state(FRONT, signals(draining=True, drain_age_s=0.0), drain) is Announcement.DRAINING
    assert state(FRONT, signals(draining=True, drain_age_s=29.9), drain) is Announcement.DRAINING
    assert state(FRONT, signals(draining=True, drain_age_s=30.0), drain) is Announcement.WITHDRAW


def test_a_drain_without_grace_stays_the_last_resort() -> None:
    drain = DrainPolicy(grace_s=None)
    sig = signals(draining=True, drain_age_s=1e9)
    assert state(FRONT, sig, drain) is Announcement.DRAINING


def test_drain_behaviour_withdraw_withdraws_at_once() -> None:
    drain = DrainPolicy(behaviour=DrainBehaviour.WITHDRAW)
    assert state(FRONT, signals(draining=True, drain_age_s=0.0), drain) is Announcement.WITHDRAW


def test_an_unhealthy_drained_region_withdraws_rather_than_drains() -> None:
    sig = signals(draining=True, drain_age_s=0.0, ready=frozenset())
    assert state(FRONT, sig) is Announcement.WITHDRAW


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("198.51.100.0/24", FRONT),
        ("2001:db8:53::/48,service=dns", DNS6),
        ("203.0.113.0/24, jurisdiction=eu", EU),
    ],
)
def test_prefix_parse(text: str, expected: AnycastPrefix) -> None:
    assert AnycastPrefix.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["198.51.100.1/24", "nonsense", "198.51.100.0/24,colour=red", "10.0.0.0/8,dns"]
)
def test_prefix_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        AnycastPrefix.parse(text)

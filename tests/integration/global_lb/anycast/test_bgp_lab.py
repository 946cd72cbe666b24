"""Anycast over real routers: three regions and three client sites in network namespaces,
BIRD 2 everywhere (gtm.testing.anycast_lab), each region's announcements written by gtm's
BIRD speaker from the announcement policy. Routes are awaited by polling with deadlines."""

from __future__ import annotations

import ipaddress
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from global_lb.anycast.policy import (
    AnycastPrefix,
    DrainPolicy,
    RegionSignals,
    Service,
    decide,
)
from global_lb.anycast.speaker import Attributes, BirdSpeaker
from gtm.testing.anycast_lab import (
    DNS_ADDRESS,
    FRONT_ADDRESS6,
    HOLD_TIME_S,
    STARTUP_S,
    AnycastLab,
    anycast_lab,
    wait_for,
)

pytestmark = pytest.mark.anycast

FRONT = AnycastPrefix(ipaddress.ip_network("198.51.100.0/24"))
EU = AnycastPrefix(ipaddress.ip_network("203.0.113.0/24"), jurisdiction="eu")
DNS = AnycastPrefix(ipaddress.ip_network("192.0.2.0/24"), Service.DNS)
FRONT6 = AnycastPrefix(ipaddress.ip_network("2001:db8:100::/48"))
FRONT_IP, EU_IP = "198.51.100.1", "203.0.113.1"
PREFIXES = (FRONT, EU, DNS, FRONT6)
BOTH = frozenset({Service.FRONT_DOOR, Service.DNS})
JURISDICTIONS = {"r1": frozenset({"eu"}), "r2": frozenset({"us"}), "r3": frozenset({"jp"})}
DRAIN = DrainPolicy(grace_s=None)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnycastLab]:
    with anycast_lab(Path(tmp_path_factory.mktemp("anycast"))) as running:
        yield running


def speaker(lab: AnycastLab, region: str) -> BirdSpeaker:
    attrs = Attributes(local_as=lab.node(region).asn, drain=DRAIN)
    return BirdSpeaker(lab.include_file(region), attrs, control_socket=lab.control_socket(region))


def signals(region: str, **changes: Any) -> RegionSignals:
    base = RegionSignals(region, JURISDICTIONS[region], BOTH)
    return replace(base, **changes)


async def announce_all(lab: AnycastLab, **changes: dict[str, object]) -> None:
    for region in lab.region_names():
        plan = decide(PREFIXES, signals(region, **changes.get(region, {})), DRAIN)
        await speaker(lab, region).apply(plan)


def serving(lab: AnycastLab, site: str, address: str = FRONT_IP) -> str | None:
    return lab.fetch(site, address)


def on(lab: AnycastLab, site: str, regions: tuple[str, ...], address: str = FRONT_IP) -> bool:
    return serving(lab, site, address) in regions


def no_route(lab: AnycastLab, site: str, address: str) -> bool:
    return lab.next_hop(site, address) is None


def direct(lab: AnycastLab, site: str, region: str) -> bool:
    return lab.as_path(site, str(FRONT)) == (lab.node(region).asn,)


def settle(lab: AnycastLab) -> None:
    """Every site on its own region, over the direct link (a route through the transit
    may arrive first and serve the same region)."""
    for index, site in enumerate(lab.site_names(), start=1):
        region = f"r{index}"
        wait_for(partial(direct, lab, site, region), 15.0, f"{site}'s direct route")
        wait_for(partial(on, lab, site, (region,)), 15.0, f"{site} on {region}")


async def test_each_site_reaches_its_nearest_region_on_the_anycast_address(
    lab: AnycastLab,
) -> None:
    await announce_all(lab)
    settle(lab)
    for index, site in enumerate(lab.site_names(), start=1):
        assert lab.as_path(site, str(FRONT)) == (65000 + index,)
        assert lab.next_hop(site, FRONT_IP) == f"r{index}"


async def test_each_site_reaches_its_nearest_region_over_ipv6_and_a_drain_moves_it(
    lab: AnycastLab,
) -> None:
    await announce_all(lab)
    settle(lab)
    for index, site in enumerate(lab.site_names(), start=1):
        region = f"r{index}"
        wait_for(partial(on, lab, site, (region,), FRONT_ADDRESS6), 10.0, f"{site} over IPv6")
    started = time.monotonic()
    await announce_all(lab, r1={"draining": True, "drain_age_s": 0.0})
    wait_for(partial(on, lab, "s1", ("r2", "r3"), FRONT_ADDRESS6), 5.0, "s1 to leave r1 (v6)")
    moved = time.monotonic() - started
    assert moved < 1.0, f"IPv6 drain took {moved:.2f} s"
    await announce_all(lab)
    wait_for(partial(on, lab, "s1", ("r1",), FRONT_ADDRESS6), 5.0, "s1 back on r1 (v6)")


def dns_from(lab: AnycastLab, site: str, regions: tuple[str, ...]) -> bool:
    return lab.query(site, DNS_ADDRESS) in regions


async def test_each_site_reaches_its_nearest_dns_and_a_failed_dns_moves_only_dns(
    lab: AnycastLab,
) -> None:
    await announce_all(lab)
    settle(lab)
    for index, site in enumerate(lab.site_names(), start=1):
        wait_for(partial(dns_from, lab, site, (f"r{index}",)), 10.0, f"{site}'s DNS")
    # r1's DNS server fails its check: its DNS prefix goes, its front door prefix stays.
    await announce_all(lab, r1={"ready": frozenset({Service.FRONT_DOOR})})
    wait_for(partial(dns_from, lab, "s1", ("r2", "r3")), 5.0, "s1's DNS to leave r1")
    assert serving(lab, "s1") == "r1"
    await announce_all(lab)
    wait_for(partial(dns_from, lab, "s1", ("r1",)), 5.0, "s1's DNS back on r1")


async def test_an_eu_only_prefix_is_never_reachable_through_a_non_eu_region(
    lab: AnycastLab,
) -> None:
    await announce_all(lab)
    settle(lab)
    for site in lab.site_names():
        wait_for(partial(on, lab, site, ("r1",), EU_IP), 10.0, f"{site} on the EU prefix")
        path = lab.as_path(site, str(EU))
        assert path is not None
        assert path[-1] == 65001
    others = {FRONT.network, DNS.network, FRONT6.network}
    assert await speaker(lab, "r2").routes() == others
    assert await speaker(lab, "r3").routes() == others
    # The EU region withdraws (front door down): the prefix is gone, not carried elsewhere,
    # though r2 and r3 hold the address and would answer.
    await announce_all(lab, r1={"ready": frozenset()})
    for site in lab.site_names():
        wait_for(partial(no_route, lab, site, EU_IP), 10.0, f"{site} to drop EU")
        assert serving(lab, site, EU_IP) is None
    await announce_all(lab)
    wait_for(lambda: serving(lab, "s2", EU_IP) == "r1", 10.0, "the EU prefix back on r1")


async def test_a_drained_region_loses_its_sites_within_a_second_and_takes_them_back(
    lab: AnycastLab,
) -> None:
    await announce_all(lab)
    settle(lab)
    started = time.monotonic()
    await announce_all(lab, r1={"draining": True, "drain_age_s": 0.0})
    wait_for(lambda: serving(lab, "s1") in ("r2", "r3"), 5.0, "s1 to leave the drained r1")
    moved = time.monotonic() - started
    assert moved < 1.0, f"drain took {moved:.2f} s"
    # Draining, not withdrawn: r1 is still announced (prepended) as the last resort.
    path = lab.birdc("s1", "show", "route", "for", FRONT_IP, "all")
    assert "65001 65001 65001 65001" in path
    await announce_all(lab)
    wait_for(lambda: serving(lab, "s1") == "r1", 5.0, "s1 back on the undrained r1")


async def test_a_crashed_region_is_routed_around_within_the_hold_time_and_restart_takes_back(
    lab: AnycastLab,
) -> None:
    await announce_all(lab)
    settle(lab)
    started = time.monotonic()
    lab.crash("r1")
    wait_for(lambda: serving(lab, "s1") in ("r2", "r3"), 10.0, "s1 to leave the crashed r1")
    moved = time.monotonic() - started
    assert moved < HOLD_TIME_S, f"crash failover took {moved:.2f} s"
    assert serving(lab, "s2") == "r2"
    lab.restart("r1")
    wait_for(lambda: serving(lab, "s1") == "r1", STARTUP_S, "s1 back on the restarted r1")
    wait_for(lab.established, STARTUP_S, "every session re-established")


def start_gtm_anycast(lab: AnycastLab, drain_file: Path) -> subprocess.Popen[bytes]:
    """`gtm anycast --speaker bird` for region r2, inside its namespace."""
    return subprocess.Popen(
        [
            "ip", "netns", "exec", lab.ns("r2"), sys.executable, "-m", "gtmctl", "anycast",
            "--speaker", "bird", "--region", "r2", "--jurisdiction", "us",
            "--prefix", str(FRONT), "--prefix", f"{EU.network},jurisdiction=eu",
            "--local-as", "65002", "--bird-include", str(lab.include_file("r2")),
            "--bird-socket", str(lab.control_socket("r2")),
            "--check", "front-door=http://127.0.0.1:8080/", "--drain-file", str(drain_file),
            "--drain-grace", "0", "--interval", "0.05", "--rise", "1", "--fall", "1",
            "--linger", "2",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


async def test_gtm_anycast_with_bird_drains_and_withdraws_on_sigterm(
    lab: AnycastLab, tmp_path: Path
) -> None:
    """The command itself (`gtm anycast --speaker bird`) in region r2's namespace, driving
    r2's BIRD through its control socket and include file."""
    await announce_all(lab)
    settle(lab)
    drain_file = tmp_path / "drain"
    process = start_gtm_anycast(lab, drain_file)
    try:
        # It took over r2's include: only what the command announces is there.
        wait_for(
            lambda: lab.include_file("r2").read_text().count(" blackhole") == 1,
            STARTUP_S,
            "gtm anycast to write r2's include",
        )
        wait_for(partial(on, lab, "s2", ("r2",)), 10.0, "s2 on r2")
        started = time.monotonic()
        drain_file.touch()
        wait_for(partial(on, lab, "s2", ("r1", "r3")), 5.0, "s2 to leave the drained r2")
        moved = time.monotonic() - started
        assert moved < 1.0, f"drain through gtm anycast took {moved:.2f} s"
        drain_file.unlink()
        wait_for(partial(on, lab, "s2", ("r2",)), 5.0, "s2 back on r2")
        process.send_signal(signal.SIGTERM)
        wait_for(partial(on, lab, "s2", ("r1", "r3")), 5.0, "s2 to leave the stopping r2")
        assert process.poll() is None, "the withdrawal took before the process exited"
        assert process.wait(timeout=10.0) == 0
        assert await speaker(lab, "r2").routes() == set()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()
    await announce_all(lab)
    wait_for(partial(on, lab, "s2", ("r2",)), 10.0, "s2 back on r2")

"""Anycast failover times over real BGP routers, next to the anchors' figures.

The namespace lab (:mod:`gtm.testing.anycast_lab`: three regions, three client sites, a
transit, BIRD 2 everywhere; each region's announcements written by gtm's BIRD speaker
from the announcement policy) is timed from the client's side: a site fetches the
anycast front door every few milliseconds, and a failover ends when the answer comes
from another region.

* planned drain: the policy turns the region to *draining* (AS-path prepend) and the
  speaker takes it; clock starts before the speaker is told;
* crash: the region's router freezes (no keepalives, no BFD: a hung host) and its front
  door dies; clock starts at the freeze. With BFD (the lab's default) and with the 3 s
  hold timer alone;
* restart: the crashed region comes back (a fresh router and front door) until its site
  is served by it again.

    python bench/anycast_failover.py            # 5 trials of each, BFD and hold timer
    python bench/anycast_failover.py --smoke    # 1 trial of each, BFD only (CI)

Needs root, ``ip`` and ``bird`` (scripts/install-system-deps).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from global_lb.anycast.policy import (
    AnycastPrefix,
    DrainPolicy,
    RegionSignals,
    Service,
    decide,
)
from global_lb.anycast.speaker import Attributes, BirdSpeaker
from gtm.testing.anycast_lab import HOLD_TIME_S, AnycastLab, anycast_lab, wait_for

FRONT = AnycastPrefix(ipaddress.ip_network("198.51.100.0/24"))
FRONT_IP = "198.51.100.1"
DRAIN = DrainPolicy(grace_s=None)
#: The anchors (issue #23): what operators get from the usual setups.
ANCHORS = (
    ("ExaBGP + health checks (hold-timer bound)", "5–15 s"),
    ("Route 53 health-checked DNS failover", "~30 s"),
)


def _apply(lab: AnycastLab, region: str, *, draining: bool) -> None:
    attrs = Attributes(lab.node(region).asn, DRAIN)
    speaker = BirdSpeaker(
        lab.include_file(region), attrs, control_socket=lab.control_socket(region)
    )
    signals = RegionSignals(
        region, frozenset(), frozenset({Service.FRONT_DOOR}), draining=draining, drain_age_s=0
    )
    asyncio.run(speaker.apply(decide((FRONT,), signals, DRAIN)))


def _moved(lab: AnycastLab, site: str, away_from: str) -> bool:
    answer = lab.fetch(site, FRONT_IP, timeout=0.05)
    return answer is not None and answer != away_from


def _back(lab: AnycastLab, site: str, region: str) -> bool:
    return lab.fetch(site, FRONT_IP, timeout=0.05) == region


def _drain(lab: AnycastLab) -> float:
    started = time.monotonic()
    _apply(lab, "r1", draining=True)
    wait_for(lambda: _moved(lab, "s1", "r1"), 10.0, "s1 to leave the drained r1")
    took = time.monotonic() - started
    _apply(lab, "r1", draining=False)
    wait_for(lambda: _back(lab, "s1", "r1"), 10.0, "s1 back on r1")
    return took


def _crash(lab: AnycastLab) -> tuple[float, float]:
    started = time.monotonic()
    lab.crash("r1")
    wait_for(lambda: _moved(lab, "s1", "r1"), 3 * HOLD_TIME_S, "s1 to leave the crashed r1")
    took = time.monotonic() - started
    started = time.monotonic()
    lab.restart("r1")
    wait_for(lambda: _back(lab, "s1", "r1"), 30.0, "s1 back on the restarted r1")
    back = time.monotonic() - started
    wait_for(lab.established, 30.0, "every session re-established")
    return took, back


def _measure(directory: Path, trials: int, bfd: bool) -> dict[str, list[float]]:
    with anycast_lab(directory, bfd=bfd) as lab:
        for region in lab.region_names():
            _apply(lab, region, draining=False)
        for index, site in enumerate(lab.site_names(), start=1):
            wait_for(partial(_back, lab, site, f"r{index}"), 20.0, f"{site} settled")
        results: dict[str, list[float]] = {"drain": [], "crash": [], "restart": []}
        for _ in range(trials):
            results["drain"].append(_drain(lab))
            crash, back = _crash(lab)
            results["crash"].append(crash)
            results["restart"].append(back)
        return results


def _row(name: str, values: list[float]) -> str:
    median = statistics.median(values)
    return f"  {name:<44} median {median:6.3f} s   max {max(values):6.3f} s   (n={len(values)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="1 trial, BFD only")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args(argv)
    trials = 1 if args.smoke else args.trials
    modes = (True,) if args.smoke else (True, False)
    print(f"anycast failover: 3 regions, 3 sites, BIRD {HOLD_TIME_S} s hold time, {trials} trials")
    for bfd in modes:
        with tempfile.TemporaryDirectory(prefix="gtm-anycast-bench-") as tmp:
            results = _measure(Path(tmp), trials, bfd)
        label = "BFD 3×100 ms" if bfd else f"hold timer {HOLD_TIME_S} s, no BFD"
        print(f"gtm anycast ({label}):")
        if bfd:
            print(_row("planned drain (prepend), site moves", results["drain"]))
        print(_row("crash, site moves", results["crash"]))
        print(_row("restart, site comes back", results["restart"]))
    print("anchors:")
    for name, figure in ANCHORS:
        print(f"  {name:<44} {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`gtm anycast --speaker exabgp` as ExaBGP's process, in the namespace lab: region r3's
speaker is a real ExaBGP peering with the site's and the transit's BIRD routers, started
on the configuration `gtm anycast --exabgp-config` prints. Drain (a drain file), SIGTERM
and the metrics are exercised through the real command."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from global_lb.anycast.policy import AnycastPrefix, DrainPolicy, RegionSignals, Service, decide
from global_lb.anycast.speaker import Attributes, BirdSpeaker
from gtm.testing.anycast_lab import STARTUP_S, AnycastLab, anycast_lab, wait_for

pytestmark = pytest.mark.anycast

FRONT = AnycastPrefix(ipaddress.ip_network("198.51.100.0/24"))
FRONT_IP, EU_IP = "198.51.100.1", "203.0.113.1"
METRICS_PORT = 9179
#: ExaBGP drops to `nobody` before starting its processes by default; the lab's files
#: live in root's private temporary directory.
EXABGP_ENV = {"exabgp_daemon_user": "root", "exabgp_daemon_drop": "false"}


@dataclass
class Running:
    lab: AnycastLab
    exabgp: subprocess.Popen[bytes]
    drain_file: Path


def gtm_anycast_args(lab: AnycastLab, drain_file: Path) -> list[str]:
    neighbours = [f"--neighbor={a},{asn},{me}" for a, asn, me in lab.neighbours("r3")]
    return [
        "anycast", "--region", "r3", "--jurisdiction", "jp",
        "--prefix", str(FRONT), "--prefix", "203.0.113.0/24,jurisdiction=eu",
        "--local-as", "65003", *neighbours, "--hold-time", "3",
        "--check", "front-door=http://127.0.0.1:8080/",
        "--drain-file", str(drain_file), "--drain-grace", "0",
        "--interval", "0.05", "--rise", "1", "--fall", "1", "--linger", "1",
        "--metrics-listen", f"127.0.0.1:{METRICS_PORT}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    directory = Path(tmp_path_factory.mktemp("anycast-exabgp"))
    with anycast_lab(directory, exabgp_regions=frozenset({"r3"})) as lab:
        for region in ("r1", "r2"):
            attrs = Attributes(lab.node(region).asn, DrainPolicy())
            bird = BirdSpeaker(
                lab.include_file(region), attrs, control_socket=lab.control_socket(region)
            )
            sig = RegionSignals(region, frozenset({"eu"}), frozenset({Service.FRONT_DOOR}))
            plan = decide((FRONT,), sig, DrainPolicy())
            asyncio.run(bird.apply(plan))
        drain_file = directory / "r3.drain"
        args = gtm_anycast_args(lab, drain_file)
        config = subprocess.run(
            [sys.executable, "-m", "gtmctl", *args, "--exabgp-config"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        exabgp = lab.start_exabgp("r3", config, EXABGP_ENV)
        wait_for(lab.established, STARTUP_S, "the sessions with ExaBGP")
        yield Running(lab, exabgp, drain_file)


def serving(lab: AnycastLab, site: str, regions: tuple[str, ...]) -> bool:
    return lab.fetch(site, FRONT_IP) in regions


def gtm_process(exabgp: subprocess.Popen[bytes]) -> int:
    """The pid of the `gtm anycast` process ExaBGP runs."""
    children = Path(f"/proc/{exabgp.pid}/task/{exabgp.pid}/children").read_text().split()
    for pid in children:
        if b"anycast" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return int(pid)
    raise AssertionError(f"no gtm anycast process among {children}")


def test_the_site_reaches_the_exabgp_region_and_never_its_eu_prefix(running: Running) -> None:
    lab = running.lab
    wait_for(partial(serving, lab, "s3", ("r3",)), STARTUP_S, "s3 on r3 through ExaBGP")
    # Over the direct session with ExaBGP (a route through the transit may come first).
    wait_for(lambda: lab.as_path("s3", str(FRONT)) == (65003,), 15.0, "s3's direct route")
    # r3 (jurisdiction jp) serves 203.0.113.1 but never announces it: nobody routes there.
    assert lab.next_hop("s3", EU_IP) is None
    state = lab.get("r3", "127.0.0.1", METRICS_PORT, "/api/v1/anycast")
    assert state is not None
    prefixes = {p["prefix"]: p["state"] for p in json.loads(state)["prefixes"]}
    assert prefixes == {"198.51.100.0/24": "announce", "203.0.113.0/24": "withdraw"}
    metrics = lab.get("r3", "127.0.0.1", METRICS_PORT, "/metrics")
    assert metrics is not None
    assert 'gtm_anycast_announced{prefix="198.51.100.0/24"} 1.0' in metrics
    assert 'gtm_anycast_announced{prefix="203.0.113.0/24"} 0.0' in metrics


def test_a_drain_file_moves_the_site_within_a_second(running: Running) -> None:
    lab = running.lab
    wait_for(partial(serving, lab, "s3", ("r3",)), 15.0, "s3 on r3")
    started = time.monotonic()
    running.drain_file.touch()
    try:
        wait_for(partial(serving, lab, "s3", ("r1", "r2")), 5.0, "s3 to leave the drained r3")
        moved = time.monotonic() - started
        assert moved < 1.0, f"drain took {moved:.2f} s"
        wait_for(lambda: lab.as_path("s3", str(FRONT)) != (65003,), 5.0, "the prepend")
    finally:
        running.drain_file.unlink()
    wait_for(partial(serving, lab, "s3", ("r3",)), 5.0, "s3 back on the undrained r3")


def test_sigterm_withdraws_before_the_process_exits(running: Running) -> None:
    lab = running.lab
    wait_for(partial(serving, lab, "s3", ("r3",)), 15.0, "s3 on r3")
    pid = gtm_process(running.exabgp)
    os.kill(pid, signal.SIGTERM)
    wait_for(partial(serving, lab, "s3", ("r1", "r2")), 5.0, "s3 to leave the stopping r3")
    # The withdrawal took while the process still runs (it lingers, then exits).
    assert not _exited(pid)
    wait_for(partial(_exited, pid), 10.0, "gtm anycast to exit")


def _exited(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone (reaped), before the open or between the open and the read (ESRCH).
        return True


def test_gtm_anycast_exits_when_exabgp_dies(running: Running) -> None:
    # Last in the module: ExaBGP does not come back.
    lab = running.lab
    # Announced and idle: it writes to ExaBGP only on a change, so nothing it does
    # would fail on the closed pipe.
    wait_for(partial(serving, lab, "s3", ("r3",)), 15.0, "s3 on r3")
    pid = _child(running.exabgp)
    assert pid is not None
    running.exabgp.kill()
    running.exabgp.wait()
    # Orphaned, it would run on (holding its metrics port against the next ExaBGP's).
    wait_for(partial(_exited, pid), 10.0, "the orphaned gtm anycast to exit")
    assert lab.get("r3", "127.0.0.1", METRICS_PORT, "/metrics") is None


def _child(exabgp: subprocess.Popen[bytes]) -> int | None:
    try:
        return gtm_process(exabgp)
    except (AssertionError, FileNotFoundError):
        return None

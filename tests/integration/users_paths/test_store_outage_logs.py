"""An etcd outage under ``gtm up --processes`` reads as an outage in every process's log.

The operator's path of the issue: the deployment runs against etcd, etcd goes away for
a while and comes back. Every process (GPU emulators, zone agents, regional LBs, the
global tier) retries against the store meanwhile; each of its retrying components must
say once that the store is gone and once that it is back (with how long it was gone) —
no traceback, no line per retry. Before, a 16 s outage wrote thousands of lines with
hundreds of tracebacks.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gtm.state.etcd_server import EtcdServer
from tests.integration.gtmctl.up.helpers import running_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Bounds for a loaded 2-core machine; each wait polls and ends when its condition holds.
WAIT_S = 60.0
STARTED = re.compile(r" failed: ")
ENDED = re.compile(r" back after \d+\.\d s \(\d+ failed attempts?\)")


def logs(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run_dir / "logs").glob("*.log"))}


async def until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        await asyncio.sleep(0.2)


async def test_an_etcd_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    run_dir = tmp_path / "run"
    async with running_up(
        tmp_path,
        *("--processes", "--state", own_etcd_server.etcd_url, "--speedup", "10"),
        regions=("eu-west",),
    ):
        before = logs(run_dir)

        def new_lines() -> dict[str, list[str]]:
            return {
                name: text[len(before.get(name, "")) :].splitlines()
                for name, text in logs(run_dir).items()
            }

        def count(pattern: re.Pattern[str]) -> int:
            return sum(
                1 for lines in new_lines().values() for line in lines if pattern.search(line)
            )

        own_etcd_server.stop()
        # Every process retries: the GPU emulators' registrations (4), the zone agents'
        # summaries (2) and snapshot watchers, the regional LB's loops and watchers.
        await until("every process noticed", lambda: count(STARTED) >= 12)
        own_etcd_server.start()
        await until("every outage ended", lambda: count(ENDED) >= count(STARTED))
        outage = new_lines()
    assert not any("Traceback" in line for lines in outage.values() for line in lines)
    for name, lines in outage.items():
        started = [line for line in lines if STARTED.search(line)]
        ended = [line for line in lines if ENDED.search(line)]
        assert len(started) == len(ended), (name, lines)
        # One line each way per retrying component, a lease renewed once, no more.
        assert len(lines) <= 2 * len(started) + 2, (name, lines)

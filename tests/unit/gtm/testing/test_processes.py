"""``gtm.testing.processes``: a real ``gtm`` child is started, reached and stopped; one
that never says it listens is a ``StartError``, not a hang; a process's /proc fields and
CPU time, and a process that is gone."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest

from gtm.testing.processes import (
    StartError,
    cpu_seconds,
    start_listening,
    stat_fields,
    tree,
    tree_cpu_seconds,
)


async def test_a_gtm_command_is_started_reached_and_stopped() -> None:
    child = await start_listening(["gpu-sim", "--port", "0", "--speedup", "100"])
    try:
        async with aiohttp.ClientSession() as session, session.get(child.url + "/healthz") as r:
            assert r.status == 200
    finally:
        await child.stop()
    assert child.proc.returncode is not None


async def test_a_command_that_does_not_listen_is_a_start_error() -> None:
    with pytest.raises(StartError, match="gtm state did not start"):
        await start_listening(["state", "--help"], timeout_s=30.0)


def test_a_process_stat_fields_and_cpu_time() -> None:
    fields = stat_fields(os.getpid())
    assert fields[0] == "R"  # this process, reading its own stat, is running
    assert int(fields[1]) == os.getppid()
    spent = cpu_seconds(os.getpid())
    sum(range(2_000_000))  # some CPU
    assert cpu_seconds(os.getpid()) > spent > 0.0
    assert tree(os.getpid())[0] == os.getpid()


def test_a_process_gone_raises_or_counts_nothing() -> None:
    # A pid no live process has (the highest the kernel hands out, plus one).
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    with pytest.raises(FileNotFoundError):
        cpu_seconds(gone)
    assert tree_cpu_seconds(gone) == 0.0

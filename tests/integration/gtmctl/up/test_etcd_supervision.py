"""``gtm up --processes`` restarts its private etcd when it dies, and the tiers go on.

A real etcd (the private one ``gtm up`` starts) is SIGKILLed from outside, as a crash or
the OOM killer would; ``gtm up`` must start it again on its data, say so once when the
outage starts and once when it ends, count the restart, and the tiers must follow the
store again (a drain written after the restart reaches DNS). Bounded by the test timeout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.gtmctl.up.helpers import Up, running_up
from tests.integration.gtmctl.up.test_up import LONDON, check_openai, eventually

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(150)]


async def _deployment(up: Up) -> dict[str, Any]:
    url = f"http://127.0.0.1:{up.http_port + 1}/api/v1/deployment"
    async with (
        aiohttp.ClientSession(headers=up.admin_headers()) as session,
        session.get(url) as response,
    ):
        assert response.status == 200
        document: dict[str, Any] = await response.json()
    return document


def _gtm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gtmctl", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


async def test_a_dead_private_etcd_is_restarted_and_the_tiers_go_on(tmp_path: Path) -> None:
    regions = ("eu-west", "eu-central")
    async with running_up(tmp_path, "--processes", "--speedup", "10", regions=regions) as up:
        before = await _deployment(up)
        [member] = before["etcd"]
        assert (member["restarts"], member["held"]) == (0, False)
        os.kill(member["pid"], signal.SIGKILL)  # not through the control API: a crash

        async def restarted() -> bool:
            [now] = (await _deployment(up))["etcd"]
            return now["restarts"] == 1 and now["pid"] not in (None, member["pid"])

        await eventually(restarted, "gtm up restarted its etcd")
        # The tiers follow the store again: a drain written now reaches DNS.
        state = before["state"]
        drained = await asyncio.to_thread(_gtm, "drain", "region", "eu-west", "--state", state)
        assert drained.returncode == 0, drained.stderr

        async def moved() -> bool:
            return await up.resolve("api.inference.example.", LONDON) == [up.address("eu-central")]

        await eventually(moved, "a drain written after the restart reaches DNS")
        await check_openai(up)
        undrained = await asyncio.to_thread(_gtm, "undrain", "region", "eu-west", "--state", state)
        assert undrained.returncode == 0, undrained.stderr
    said = (tmp_path / "up.stderr").read_text()
    assert said.count(f"etcd member {member['name']} died") == 1, said[-3000:]
    assert said.count(f"etcd member {member['name']} is back") == 1, said[-3000:]


async def test_an_etcd_stopped_through_the_control_api_stays_down(tmp_path: Path) -> None:
    async with running_up(tmp_path, "--processes", "--speedup", "10", regions=("eu-west",)) as up:
        url = f"http://127.0.0.1:{up.http_port + 1}/api/v1/etcd/stop"
        async with (
            aiohttp.ClientSession(headers=up.admin_headers()) as session,
            session.post(url) as response,
        ):
            assert response.status == 200
            [member] = (await response.json())["members"]
        assert (member["pid"], member["held"]) == (None, True)
        # The keeper checks every ETCD_CHECK_S; a few rounds later it is still down.
        for _ in range(6):
            await asyncio.sleep(0.5)
            [now] = (await _deployment(up))["etcd"]
            assert (now["pid"], now["restarts"]) == (None, 0)
        async with (
            aiohttp.ClientSession(headers=up.admin_headers()) as session,
            session.post(url.replace("/stop", "/start")) as response,
        ):
            assert response.status == 200
        [now] = (await _deployment(up))["etcd"]
        assert now["pid"] is not None
        assert now["held"] is False

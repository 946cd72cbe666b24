"""``gtm up --processes`` restarts its private etcd when it dies (the users' paths suite,
tests/integration/users_paths/test_operator_cli.py, kills it and watches it come back), but
not when the control API stopped it on purpose: a game day's etcd outage must last until
its rollback starts etcd again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.gtmctl.up.helpers import Up, running_up

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

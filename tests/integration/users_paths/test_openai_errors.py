"""A client that calls a wrong path or method gets OpenAI's error JSON from every tier.

``gtm up --processes`` on private loopback addresses; the client talks to the front
door, to the regional LB (the address ``<region>.api`` hands out) and to a zone agent
directly, as a user with a mistyped base URL or a ``GET`` where ``POST`` is due would.
Before, the front door answered these in aiohttp's plain text and the other tiers lost
the ``Allow`` header and named no reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gtm.state.etcd_server import EtcdServer
from tests.integration.gtmctl.up.helpers import Up, running_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _answer(session: aiohttp.ClientSession, method: str, url: str) -> tuple[int, Any, str]:
    async with session.request(method, url) as response:
        return response.status, await response.json(), response.headers.get("Allow", "")


def _tiers(up: Up) -> dict[str, str]:
    region = up.topology.regions[0]
    zone_port = up.topology.zone_port(region, region.zones[0])
    return {
        "front door": up.base_url,
        "regional LB": f"http://{region.address}:{up.http_port}",
        "zone agent": f"http://{region.address}:{zone_port}",
    }


async def test_unknown_paths_and_wrong_methods_are_openai_json_at_every_tier(
    tmp_path: Path, own_etcd_server: EtcdServer
) -> None:
    async with (
        running_up(
            tmp_path,
            *("--processes", "--state", own_etcd_server.etcd_url, "--speedup", "10"),
            regions=("eu-west",),
        ) as up,
        aiohttp.ClientSession() as session,
    ):
        for tier, base in _tiers(up).items():
            status, body, _ = await _answer(session, "GET", f"{base}/v1/chat/completion")
            assert status == 404, tier
            assert body["error"]["code"] == "unknown_url", tier
            assert body["error"]["message"] == "Invalid URL (GET /v1/chat/completion)", tier
            status, body, allow = await _answer(session, "GET", f"{base}/v1/chat/completions")
            assert status == 405, tier
            assert allow == "POST", tier
            assert body["error"]["code"] == "method_not_allowed", tier
            assert body["error"]["type"] == "invalid_request_error", tier

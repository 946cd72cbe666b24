"""``gtm chaos proxy`` as a real process: --config applied at start-up, clean SIGINT."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.integration.chaos.conftest import WAIT, Upstream

pytestmark = pytest.mark.integration

PROXY_COMMAND = [sys.executable, "-m", "gtmctl", "chaos", "proxy", "--port", "0", "--seed", "1"]


async def start(*extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *PROXY_COMMAND,
        *extra,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def api_url(process: asyncio.subprocess.Process) -> str:
    assert process.stderr is not None
    while True:
        line = (await asyncio.wait_for(process.stderr.readline(), WAIT)).decode()
        assert line, "gtm chaos proxy exited before listening"
        if "listening on " in line:
            return line.rsplit("listening on ", 1)[1].strip()


async def test_serves_the_config_and_stops_on_sigint(tmp_path: Path, echo: Upstream) -> None:
    config = tmp_path / "proxies.json"
    config.write_text(
        json.dumps([{"name": "db", "listen": "127.0.0.1:0", "upstream": echo.address}])
    )
    process = await start("--config", str(config))
    try:
        url = await api_url(process)
        assert url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as session, session.get(url + "/proxies") as reply:
            proxies = json.loads(await reply.read())
        assert list(proxies) == ["db"]
        assert proxies["db"]["enabled"] is True
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), WAIT)
    assert code == 0


async def test_a_bad_config_stops_start_up_with_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "proxies.json"
    config.write_text(json.dumps([{"upstream": "127.0.0.1:1"}]))
    process = await start("--config", str(config))
    _stdout, stderr = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode == 1
    assert "--config: missing required field: name at proxy 1" in stderr.decode()

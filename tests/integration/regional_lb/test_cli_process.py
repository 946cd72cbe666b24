"""``gtm regional`` as a real process; Ctrl-C stops it cleanly."""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp
import pytest

from policies.loader import examples_path

pytestmark = pytest.mark.integration

STARTUP_TIMEOUT = 20.0


async def test_gtm_regional_serves_and_stops_on_sigint() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gtmctl",
        "regional",
        "--region",
        "eu-west",
        "--listen",
        "127.0.0.1:0",
        "--policies",
        str(examples_path()),
        "--replica-id",
        "eu-west-test",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT)).decode()
        assert "listening on http://127.0.0.1:" in line, line
        assert "eu-west-test" in line
        url = line.split("listening on ")[1].split()[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/healthz") as response:
                assert response.status == 200
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": "Bearer gtm-demo-eu"}
            async with http.post(
                url + "/v1/chat/completions", json=body, headers=headers
            ) as response:
                # The demo key is valid, but no zone serves the model in this empty region.
                assert response.status == 404
                assert (await response.json())["error"]["code"] == "model_not_found"
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), STARTUP_TIMEOUT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

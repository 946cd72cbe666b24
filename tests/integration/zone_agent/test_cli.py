"""``gtm zone`` as a real process in front of an emulated worker; Ctrl-C stops it cleanly."""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp
import pytest

from gpusim.server import GpuSimServer
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry

from .conftest import sim_config

pytestmark = pytest.mark.integration

STARTUP_TIMEOUT = 20.0


async def test_gtm_zone_serves_and_stops_on_sigint() -> None:
    sim = GpuSimServer(sim_config("H100"), registry=new_registry())
    await sim.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gtmctl",
        "zone",
        "--zone",
        "zone-a",
        "--region",
        "region-1",
        "--listen",
        "127.0.0.1:0",
        "--worker",
        f"{sim.url},gpu=H100,id=gpu-0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT)).decode()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ")[1].split()[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/readyz") as response:
                assert response.status == 200
            body = {
                "model": LLAMA_8B,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            }
            async with http.post(url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["x-gtm-gpu"] == "gpu-0"
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), STARTUP_TIMEOUT) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await sim.stop()

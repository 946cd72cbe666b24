"""``gtm gpu-sim`` as a real process: it prints where it listens, serves, stops cleanly on
SIGTERM and SIGINT, and exits with status 70 on an injected crash."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from gtm.gpu_profiles import LLAMA_8B

pytestmark = pytest.mark.integration

#: Generous: a cold interpreter importing aiohttp, pydantic, prometheus on a loaded CI box.
STARTUP_TIMEOUT = 30.0


@dataclass
class Process:
    proc: asyncio.subprocess.Process
    url: str

    async def wait(self) -> tuple[int, str]:
        _, stderr = await asyncio.wait_for(self.proc.communicate(), STARTUP_TIMEOUT)
        assert self.proc.returncode is not None
        return self.proc.returncode, stderr.decode()


@pytest.fixture
async def gpu_sim() -> AsyncIterator[Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gtmctl",
        "gpu-sim",
        "--port",
        "0",
        "--speedup",
        "1000",
        "--seed",
        "3",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT)).decode()
    match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert match, line
    process = Process(proc, match.group(1))
    yield process
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def _chat(url: str) -> None:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        response = await client.chat.completions.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert response.usage is not None
    assert response.usage.completion_tokens >= 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_serves_then_stops_cleanly_on_signal(
    gpu_sim: Process, signum: signal.Signals
) -> None:
    await _chat(gpu_sim.url)
    gpu_sim.proc.send_signal(signum)
    status, stderr = await gpu_sim.wait()
    assert status == 0
    assert "Traceback" not in stderr


async def test_injected_crash_exits_with_status_70(gpu_sim: Process) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(gpu_sim.url + "/admin/faults", json={"crash": True})
    assert response.status_code == 200
    status, _ = await gpu_sim.wait()
    assert status == 70
    with pytest.raises(openai.APIConnectionError):
        await _chat(gpu_sim.url)


async def test_an_http2_preface_is_refused_in_one_log_line_without_traceback(
    gpu_sim: Process,
) -> None:
    """sglang-router probes a joining worker with HTTP/2's preface: a 400, one log line."""
    host, port = gpu_sim.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), STARTUP_TIMEOUT)
    writer.close()
    await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.0 400 ") or answer == b"", answer
    await _chat(gpu_sim.url)  # still serving
    gpu_sim.proc.send_signal(signal.SIGTERM)
    status, stderr = await gpu_sim.wait()
    assert status == 0
    assert "Traceback" not in stderr
    logged = [line for line in stderr.splitlines() if "logger=aiohttp.server" in line]
    assert len(logged) == 1, stderr
    assert "Pause on PRI/Upgrade" in logged[0]

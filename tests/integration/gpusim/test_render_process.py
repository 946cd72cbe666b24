"""``gtm gpu-sim``'s renderer (gpusim.render) as real processes: the first
``/v1/completions/render`` starts one process of the worker's own that answers the
engine's token ids, and it goes away with the worker — on a clean stop and when the
worker is killed outright (SIGKILL runs no cleanup)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from gtm.gpu_profiles import LLAMA_8B
from gtm.testing.processes import start_listening
from gtm.tokens import encode_text

pytestmark = pytest.mark.integration

#: How long a renderer may outlive its worker: its orphan check runs every second.
GONE_WITHIN_S = 10.0


def children(pid: int) -> set[int]:
    return {
        int(child)
        for task in Path(f"/proc/{pid}/task").glob("*/children")
        for child in task.read_text().split()
    }


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is gone, only not yet reaped


async def gone(pids: set[int]) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
async def test_the_renderer_starts_at_the_first_render_and_ends_with_its_worker(
    stop: signal.Signals,
) -> None:
    worker = await start_listening(["gpu-sim", "--port", "0", "--speedup", "1000"])
    try:
        before = children(worker.proc.pid)
        async with httpx.AsyncClient(base_url=worker.url, timeout=30) as http:
            response = await http.post(
                "/v1/completions/render", json={"model": LLAMA_8B, "prompt": "one two three"}
            )
        assert response.status_code == 200
        assert response.json()[0]["token_ids"] == list(encode_text("one two three"))
        started = children(worker.proc.pid) - before
        assert started, "the render was answered without a renderer process"
        assert os.getpid() not in started
    finally:
        await worker.stop(stop)
    assert await gone(started), f"renderer processes {started} outlived their worker"

"""``gtm.testing.processes``: a real ``gtm`` child is started, reached and stopped; one
that never says it listens is a ``StartError``, not a hang."""

from __future__ import annotations

import aiohttp
import pytest

from gtm.testing.processes import StartError, start_listening


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

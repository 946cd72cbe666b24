"""bench.peers' router handle: a peer's log lives as long as the peer did, unless the
caller chose where it goes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bench.peers import Peer, PeerRouter


async def _router(tmp_path: Path, own: bool) -> PeerRouter:
    directory = tmp_path / "logs"
    directory.mkdir()
    log_path = directory / "peer.log"
    log_path.write_text("started processing request\n")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "input()", stdin=-1)
    return PeerRouter(
        Peer.SGLANG, "cache_aware", "http://127.0.0.1:1", proc, log_path,
        own_dir=directory if own else None,
    )  # fmt: skip


async def test_stop_removes_the_log_directory_it_made(tmp_path: Path) -> None:
    router = await _router(tmp_path, own=True)
    assert router.log_tail() == "started processing request"
    await router.stop()
    assert router.proc.returncode is not None
    assert not (tmp_path / "logs").exists()
    await router.stop()  # twice: nothing left to do


async def test_stop_keeps_a_log_directory_the_caller_gave(tmp_path: Path) -> None:
    router = await _router(tmp_path, own=False)
    await router.stop()
    assert router.proc.returncode is not None
    assert router.log_tail() == "started processing request"

"""gtm zone's event loop: uvloop when installed, asyncio's otherwise or on request."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from zone_agent.loop import LoopKind, loop_factory, run


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_auto_and_uvloop_run_on_uvloop() -> None:
    assert loop_factory(LoopKind.AUTO) is uvloop.new_event_loop
    assert issubclass(run(_loop_type(), LoopKind.AUTO), uvloop.Loop)
    assert issubclass(run(_loop_type(), LoopKind.UVLOOP), uvloop.Loop)


def test_asyncio_on_request() -> None:
    loop_type = run(_loop_type(), LoopKind.ASYNCIO)
    assert not issubclass(loop_type, uvloop.Loop)
    assert issubclass(loop_type, asyncio.AbstractEventLoop)


def test_without_uvloop_auto_falls_back_and_uvloop_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import raises ModuleNotFoundError
    assert loop_factory(LoopKind.AUTO) is asyncio.new_event_loop
    with pytest.raises(ModuleNotFoundError):
        loop_factory(LoopKind.UVLOOP)

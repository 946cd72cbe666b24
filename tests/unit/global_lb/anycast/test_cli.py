"""`gtm anycast` run by ExaBGP ends when ExaBGP does (global_lb.anycast.cli)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from global_lb.anycast.cli import exit_with_parent
from global_lb.anycast.controller import AnycastController
from global_lb.anycast.policy import Announcement, AnycastPrefix
from tests.unit.global_lb.anycast.test_controller import RecordingSpeaker, source

FRONT = AnycastPrefix.parse("198.51.100.0/24")


async def test_the_controller_is_abandoned_when_its_parent_exits(tmp_path: Path) -> None:
    speaker = RecordingSpeaker()
    controller = AnycastController((FRONT,), source(tmp_path), speaker, linger_s=3600.0)
    # A stand-in for ExaBGP: a process whose exit the watch must see.
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; sys.stdin.read()", stdin=asyncio.subprocess.PIPE
    )
    await controller.step()  # announced
    async with asyncio.TaskGroup() as group:
        watch = group.create_task(exit_with_parent(parent.pid, controller))
        run = group.create_task(controller.run())
        await asyncio.sleep(0)
        assert not watch.done()
        assert parent.stdin is not None
        parent.stdin.close()  # it reads to the end of its input, then exits
        assert await parent.wait() == 0
    # The run returned (the task group ended) without withdrawing: nobody is left to
    # withdraw through. Its one plan is the announcement.
    assert run.result() is None
    assert [[d.announcement for d in p.decisions] for p in speaker.plans] == [
        [Announcement.ANNOUNCE]
    ]

import asyncio
import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtm.memdebug import DIR_ENV, FRAMES_ENV, TASKS_SUFFIX, install_from_env, snapshot_path
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor


@pytest.fixture
def restored() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGUSR2)
    tracing = tracemalloc.is_tracing()
    yield
    signal.signal(signal.SIGUSR2, handler)
    if not tracing:
        tracemalloc.stop()


def test_off_without_the_variable(restored: None) -> None:
    handler = signal.getsignal(signal.SIGUSR2)
    assert install_from_env({}) is False
    assert signal.getsignal(signal.SIGUSR2) is handler


def test_each_sigusr2_writes_a_numbered_snapshot(tmp_path: Path, restored: None) -> None:
    target = tmp_path / "snaps"
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    assert install_from_env({DIR_ENV: str(target), FRAMES_ENV: "3"}) is True
    assert not tracemalloc.is_tracing()  # the first signal starts it
    kept = [bytearray(1000) for _ in range(100)]
    os.kill(os.getpid(), signal.SIGUSR2)
    assert tracemalloc.is_tracing()
    assert tracemalloc.get_traceback_limit() == 3
    kept += [bytearray(1000) for _ in range(500)]
    os.kill(os.getpid(), signal.SIGUSR2)
    first = snapshot_path(target, os.getpid(), 1)
    second = snapshot_path(target, os.getpid(), 2)
    assert sorted(target.iterdir()) == [first, second]
    grown = tracemalloc.Snapshot.load(str(second)).compare_to(
        tracemalloc.Snapshot.load(str(first)), "filename"
    )
    here = [s for s in grown if s.traceback[0].filename == __file__]
    assert here
    assert here[0].size_diff >= 500 * 1000
    assert len(kept) == 600


def test_inside_an_event_loop_the_tasks_stacks_are_written_too(
    tmp_path: Path, restored: None
) -> None:
    target = tmp_path / "snaps"
    install_from_env({DIR_ENV: str(target)})

    async def main() -> None:
        release = asyncio.Event()
        async with TaskSupervisor(registry=new_registry()) as supervisor:
            supervisor.spawn("stuck-handler", release.wait())
            await asyncio.sleep(0)
            os.kill(os.getpid(), signal.SIGUSR2)
            await asyncio.sleep(0)
            release.set()

    asyncio.run(main())
    tasks = snapshot_path(target, os.getpid(), 1).with_suffix(TASKS_SUFFIX).read_text()
    assert "--- gtm:stuck-handler" in tasks
    assert " wait\n" in tasks  # the line it waits on


def test_a_failing_dump_is_logged_and_the_process_lives_on(
    tmp_path: Path, restored: None, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "snaps"
    install_from_env({DIR_ENV: str(target)})
    target.rmdir()  # nowhere to write
    os.kill(os.getpid(), signal.SIGUSR2)
    assert "could not write an allocation snapshot" in caplog.text

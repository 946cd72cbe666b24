import asyncio
import json
import os
import signal
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtm.memdebug import (
    DIR_ENV,
    FRAMES_ENV,
    MALLOC_SUFFIX,
    SUFFIX,
    TASKS_SUFFIX,
    install_from_env,
    read_malloc,
    snapshot_path,
)
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
    assert sorted(target.glob(f"*{SUFFIX}")) == [first, second]
    assert first.with_suffix(MALLOC_SUFFIX).exists()
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


def test_each_signal_writes_the_allocators_figures(tmp_path: Path, restored: None) -> None:
    target = tmp_path / "snaps"
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    install_from_env({DIR_ENV: str(target), FRAMES_ENV: "0"})
    os.kill(os.getpid(), signal.SIGUSR2)
    kept = [bytearray(64) for _ in range(200_000)]  # small blocks: pymalloc's arenas
    os.kill(os.getpid(), signal.SIGUSR2)
    # Frames 0: no tracing, no snapshot; the figures and nothing else.
    assert not tracemalloc.is_tracing()
    assert not list(target.glob(f"*{SUFFIX}"))
    first, second = (
        read_malloc(snapshot_path(target, os.getpid(), n).with_suffix(MALLOC_SUFFIX))
        for n in (1, 2)
    )
    grown = 200_000 * 64
    used = "pymalloc.bytes_in_allocated_blocks"
    assert second[used] - first[used] >= grown
    # Whether new arenas were needed depends on the free room earlier tests left in the
    # existing ones; that the count is written is what this test can pin.
    assert (
        second["pymalloc.arenas_allocated_current"]
        >= first["pymalloc.arenas_allocated_current"]
        > 0
    )
    assert "tracemalloc.current" not in second
    assert second["mallinfo2.uordblks"] > 0
    assert len(kept) == 200_000


_MMAPPED_PROBE = """
import ctypes, json
from gtm.memdebug import mallinfo2
before = mallinfo2()
block = ctypes.create_string_buffer(64 << 20)
after = mallinfo2()
print(json.dumps({"grown": after["hblkhd"] - before["hblkhd"], "size": len(block)}))
"""


def test_mallinfo2_counts_a_large_block_as_mmapped() -> None:
    # In a fresh process: in this one, a free heap chunk left by earlier tests may serve a
    # large block without mmap (malloc(3) looks in its bins first), and after a large
    # free glibc raises its mmap threshold. 64 MiB is above that threshold's ceiling.
    done = subprocess.run(
        [sys.executable, "-c", _MMAPPED_PROBE], capture_output=True, text=True, check=True
    )
    figures = json.loads(done.stdout)
    assert figures["size"] == 64 << 20
    assert figures["grown"] >= 64 << 20

import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtm.memdebug import DIR_ENV, FRAMES_ENV, install_from_env, snapshot_path


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

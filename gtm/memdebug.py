"""Allocation snapshots on demand, for finding what grows (off unless asked for).

With ``GTM_TRACEMALLOC_DIR`` set in its environment, a ``gtm`` process answers
SIGUSR2: the first one starts tracing its Python allocations (:mod:`tracemalloc`,
``GTM_TRACEMALLOC_FRAMES`` frames per allocation, default :data:`DEFAULT_FRAMES`), and
each one writes a snapshot to ``$GTM_TRACEMALLOC_DIR/<pid>-<n>.tracemalloc`` (and
the stacks of its event loop's tasks to ``<pid>-<n>.tasks``). The
second snapshot compared with the first (``Snapshot.compare_to``) names the lines whose
allocations made after the first signal are still alive: what grew in between. That is
how ``bench/soak.py --tracemalloc`` finds the structure behind a rising RSS.

Python's live objects are not the whole RSS: the C allocator keeps freed memory it
cannot give back (a heap whose top is still in use, arenas of other threads), and
Python's own small-object allocator keeps an arena while one object in it lives. So
each signal also writes ``<pid>-<n>.malloc``: glibc's ``mallinfo2`` (bytes in use and
free inside its arenas, and in mmapped chunks), Python's traced total, and the
small-object allocator's statistics (``sys._debugmallocstats``: arenas, used and free
blocks). Live objects flat while RSS grows, and free bytes in the arenas growing, is
fragmentation, not a leak. ``GTM_TRACEMALLOC_FRAMES=0`` writes only these figures and
the task stacks, without tracing (tracing changes the allocation pattern it measures);
it is also the only way to get the small-object allocator's figures, which CPython
does not print while tracemalloc's hooks sit in front of that allocator. Since every
``gtm`` process trims its heap every minute (:mod:`gtm.heaptrim`), "free inside the
heap" counts bytes, not resident pages: RSS holds only the free pages a trim could not
give back (partly used ones).
Tracing
starts at the signal, not at start-up, so start-up runs at full speed (a deployment of
forty traced processes does not start on a small machine) and what start-up allocated
(modules, the app) is not in the way.

Tracing makes every allocation slower and keeps a traceback per live block, so it is a
diagnosis tool, never a serving mode: nothing happens without the variable, and the
variable is read once, at start-up (:func:`install_from_env`, called by the ``gtm``
command before any subcommand runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import itertools
import logging
import os
import signal
import sys
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

#: Where snapshots go; unset: no tracing.
DIR_ENV = "GTM_TRACEMALLOC_DIR"
FRAMES_ENV = "GTM_TRACEMALLOC_FRAMES"
#: Enough frames to see past the container (a dict's ``__setitem__``) to its owner.
#: 0: no tracing; each signal writes the allocator figures and task stacks only.
DEFAULT_FRAMES = 6
#: The snapshot files' suffix, and those of the task stacks and the allocator figures
#: written with each.
SUFFIX = ".tracemalloc"
TASKS_SUFFIX = ".tasks"
MALLOC_SUFFIX = ".malloc"
#: ``struct mallinfo2``'s fields (glibc 2.33+), in order: all ``size_t``.
MALLINFO2_FIELDS = (
    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
    "fordblks", "keepcost",
)  # fmt: skip


def snapshot_path(directory: Path, pid: int, n: int) -> Path:
    return directory / f"{pid}-{n}{SUFFIX}"


def install_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Answer SIGUSR2 (start tracing, write a snapshot) when ``GTM_TRACEMALLOC_DIR`` is
    set; whether it is. Called once per process, in the main thread (signal handlers
    live there)."""
    directory = environ.get(DIR_ENV)
    if not directory:
        return False
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    frames = int(environ.get(FRAMES_ENV, DEFAULT_FRAMES))
    counter = itertools.count(1)

    def dump(signum: int, frame: FrameType | None) -> None:
        # A signal handler's exception would end the process: a diagnosis must not.
        try:
            _dump(target, frames, next(counter))
        except Exception:
            log.exception("could not write an allocation snapshot to %s", target)

    signal.signal(signal.SIGUSR2, dump)
    return True


def _dump(target: Path, frames: int, n: int) -> None:
    if frames > 0 and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    gc.collect()  # what is left is alive, not garbage waiting for a collection
    path = snapshot_path(target, os.getpid(), n)
    _dump_malloc(path.with_suffix(MALLOC_SUFFIX))
    _dump_tasks(path.with_suffix(TASKS_SUFFIX))
    if tracemalloc.is_tracing():
        partial = path.with_suffix(".partial")
        tracemalloc.take_snapshot().dump(str(partial))
        partial.rename(path)  # readers never see half a file


def mallinfo2() -> dict[str, int]:
    """glibc's allocator figures for the whole process (every arena), in bytes and
    counts; empty where there is no ``mallinfo2`` (another C library)."""
    name = ctypes.util.find_library("c")
    try:
        function = ctypes.CDLL(name).mallinfo2
    except (OSError, AttributeError):
        return {}

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(field, ctypes.c_size_t) for field in MALLINFO2_FIELDS]

    function.restype = Mallinfo2
    info = function()
    return {field: int(getattr(info, field)) for field in MALLINFO2_FIELDS}


def read_malloc(path: Path) -> dict[str, int]:
    """The figures of a ``.malloc`` file: its ``key value`` lines, and the
    small-object allocator's ``# name = 1,234`` lines as ``pymalloc.<name>``."""
    out: dict[str, int] = {}
    for line in path.read_text("utf-8").splitlines():
        if line.startswith("# ") and "=" in line:
            name, _, value = line[2:].partition("=")
            out["pymalloc." + "_".join(name.split())] = int(value.strip().replace(",", ""))
        elif line and not line.startswith(("#", " ")) and " " in line and "=" not in line:
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    return out


def _dump_malloc(path: Path) -> None:
    """``key value`` lines (mallinfo2, Python's traced bytes), a blank line, then the
    small-object allocator's statistics, which CPython prints only to file descriptor 2."""
    figures = {f"mallinfo2.{k}": v for k, v in mallinfo2().items()}
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        figures |= {"tracemalloc.current": current, "tracemalloc.peak": peak}
    partial = path.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as out:
        out.writelines(f"{k} {v}\n" for k, v in figures.items())
        out.write("\n")
        out.flush()
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    partial.rename(path)


def _dump_tasks(path: Path) -> None:
    """The stack of every task of the running event loop (a handler that never ends
    holds its connection: this says where it waits)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    with path.open("w", encoding="utf-8") as out:
        for task in asyncio.all_tasks(loop):
            out.write(f"--- {task.get_name()}\n")
            for frame in task.get_stack(limit=16):
                code = frame.f_code
                out.write(f"  {code.co_filename}:{frame.f_lineno} {code.co_name}\n")


__all__ = [
    "DEFAULT_FRAMES",
    "DIR_ENV",
    "FRAMES_ENV",
    "MALLOC_SUFFIX",
    "SUFFIX",
    "TASKS_SUFFIX",
    "install_from_env",
    "mallinfo2",
    "read_malloc",
    "snapshot_path",
]

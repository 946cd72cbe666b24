"""Allocation snapshots on demand, for finding what grows (off unless asked for).

With ``GTM_TRACEMALLOC_DIR`` set in its environment, a ``gtm`` process answers
SIGUSR2: the first one starts tracing its Python allocations (:mod:`tracemalloc`,
``GTM_TRACEMALLOC_FRAMES`` frames per allocation, default :data:`DEFAULT_FRAMES`), and
each one writes a snapshot to ``$GTM_TRACEMALLOC_DIR/<pid>-<n>.tracemalloc`` (and
the stacks of its event loop's tasks to ``<pid>-<n>.tasks``). The
second snapshot compared with the first (``Snapshot.compare_to``) names the lines whose
allocations made after the first signal are still alive: what grew in between. That is
how ``bench/soak.py --tracemalloc`` finds the structure behind a rising RSS. Tracing
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
import gc
import itertools
import logging
import os
import signal
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

#: Where snapshots go; unset: no tracing.
DIR_ENV = "GTM_TRACEMALLOC_DIR"
FRAMES_ENV = "GTM_TRACEMALLOC_FRAMES"
#: Enough frames to see past the container (a dict's ``__setitem__``) to its owner.
DEFAULT_FRAMES = 6
#: The snapshot files' suffix, and that of the task stacks written with each.
SUFFIX = ".tracemalloc"
TASKS_SUFFIX = ".tasks"


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
    if not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    gc.collect()  # what is left is alive, not garbage waiting for a collection
    path = snapshot_path(target, os.getpid(), n)
    partial = path.with_suffix(".partial")
    tracemalloc.take_snapshot().dump(str(partial))
    partial.rename(path)  # readers never see half a file
    _dump_tasks(path.with_suffix(TASKS_SUFFIX))


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
    "SUFFIX",
    "TASKS_SUFFIX",
    "install_from_env",
    "snapshot_path",
]

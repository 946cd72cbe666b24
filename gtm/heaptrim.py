"""The C allocator's free pages handed back to the system every minute, from a thread.

Python objects larger than 512 bytes (request bodies, JSON text, socket buffers, a
dict's or a list's table) come from glibc's ``malloc``. Freed, their memory stays in
the heap for reuse, and glibc returns pages to the system only from the top of a heap:
one block still in use above them keeps every free page below it resident. So a
serving process's peaks (the longest prompt so far, the most streams at once) raised
its RSS for good although its live memory came back down: in the soak
(``bench/soak.py``) every tier's RSS stepped up at new peaks while :mod:`gtm.memdebug`'s
allocator figures showed the growth as free bytes inside the heap, not live ones.

``malloc_trim(0)`` (glibc 2.8 and later) gives every whole free page inside every arena
back to the system (``madvise(MADV_DONTNEED)``), keeping the address range: the next
allocation there faults in a zeroed page. :func:`start` runs it every
:data:`TRIM_INTERVAL_S` seconds from a daemon thread of its own, one per process (a
second call finds it running). ctypes releases the GIL for the call, so the event loop
runs on while it walks the free lists; it holds each arena's lock in turn, briefly.
Where the C library has no ``malloc_trim`` (musl, macOS) nothing is started.

Python's small-object allocator keeps arenas of its own, returned only when empty:
those are kept small by not making many small objects at once per request (the spans of
:mod:`gtm.tokens`), not by this.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable

#: Seconds between two trims. A trim of a heap with many free pages takes a few ms
#: (one with few, well under one); memory freed at a peak is back within this long.
TRIM_INTERVAL_S = 60.0
#: The trimming thread's name: how :func:`start` finds it already running.
THREAD_NAME = "gtm-heap-trim"

Trim = Callable[[int], int]


def malloc_trim() -> Trim | None:
    """The C library's ``malloc_trim(pad)`` (returns 1 when memory was released), or
    None where there is none."""
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    trim: Trim = function
    return trim


def start(interval_s: float = TRIM_INTERVAL_S) -> threading.Thread | None:
    """Start trimming this process's heap every ``interval_s`` seconds (once per
    process: the running thread when there is one); None without ``malloc_trim``."""
    trim = malloc_trim()
    if trim is None:
        return None
    for thread in threading.enumerate():
        if thread.name == THREAD_NAME:
            return thread
    thread = threading.Thread(
        target=_trim_forever, args=(trim, interval_s), name=THREAD_NAME, daemon=True
    )
    thread.start()
    return thread


def _trim_forever(trim: Trim, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        trim(0)


__all__ = ["THREAD_NAME", "TRIM_INTERVAL_S", "malloc_trim", "start"]

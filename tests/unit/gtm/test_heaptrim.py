"""gtm.heaptrim: the free pages inside the C heap go back to the system; one trimming
thread per process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from gtm import heaptrim

#: In a fresh process: fill the heap with blocks too big for Python's small-object
#: allocator, free all but every 50th (which pin the heap's top, so glibc cannot shrink
#: it), then trim. Prints anonymous RSS (KB) before and after the trim.
FRAGMENTED_HEAP = """
import json
from gtm.heaptrim import malloc_trim

def anon_kb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon"))

blocks = [bytes(4000 + i % 7) for i in range(20_000)]
kept = blocks[::50]
del blocks
before = anon_kb()
released = malloc_trim()(0)
print(json.dumps({"before": before, "after": anon_kb(), "released": released}))
"""


def test_a_trim_gives_back_the_free_pages_a_kept_block_pins() -> None:
    assert heaptrim.malloc_trim() is not None  # glibc (the CI and this project's images)
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, check=True
    )
    figures = json.loads(done.stdout)
    assert figures["released"] == 1
    # ~78 MB allocated, ~1.6 MB kept: most of it goes back.
    assert figures["before"] - figures["after"] > 40_000


def test_one_trimming_thread_per_process() -> None:
    first = heaptrim.start(interval_s=3600.0)
    assert first is not None
    assert first.daemon
    assert first.name == heaptrim.THREAD_NAME
    assert heaptrim.start() is first
    assert sum(t.name == heaptrim.THREAD_NAME for t in threading.enumerate()) == 1


def test_the_gtm_command_starts_it() -> None:
    code = (
        "import sys, threading\n"
        "from click.testing import CliRunner\n"
        "from gtmctl.cli import cli\n"
        "CliRunner().invoke(cli, ['policy', '--help'])\n"
        "print(sum(t.name == 'gtm-heap-trim' for t in threading.enumerate()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1"

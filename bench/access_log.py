"""The access line's writing: CPU per line and ``write(2)`` calls per line, text and JSON.

Every request a tier serves writes one access line (:mod:`gtm.access`) through
:class:`gtm.logs.LineWriter` to gtm's log handler; this is that cost alone. The stream
is built as Python builds ``sys.stderr`` when it is not a terminal (a line-buffered
text layer over a buffered writer over the file descriptor), its descriptor
``/dev/null``, with the raw layer counting its ``write`` calls — each one a system
call on a real stderr.

The lines are written from an event loop, ``BATCH`` per loop iteration (a proxy at
concurrency 16 finishes about that many requests per iteration), with the fields a
zone agent's proxied request has. Columns per format: process CPU µs per line written
(the best of five runs, so other processes' load moves it less than wall time would),
of which formatting the line alone (the formatter's ``info_line``), and the ``write``
calls per line (the batch is written every ``gtm.logs.FLUSH_INTERVAL_S``, and at the
end of each run).

    python bench/access_log.py            # 5 × 20,000 lines per format
    python bench/access_log.py --smoke    # 5 × 400 (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import os
import time
from typing import TYPE_CHECKING, cast

from gtm.logs import JsonFormatter, LineWriter, LogFormat, TextFormatter, configure

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

#: Lines written per event-loop iteration.
BATCH = 16

#: A zone agent's access line for a proxied, streamed chat completion (gtm.access).
FIELDS: dict[str, object] = {
    "request_id": "9f1c2b7e4a5d4c3b8e2f1a0b9c8d7e6f",
    "decision_id": "d-5e2a9c",
    "tenant": "berlin-demo",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "country": "DE",
    "location_source": "header",
    "region": "eu-central",
    "zone": "eu-central-1a",
    "gpu": "gpu-017",
    "spill_from": None,
    "spill_to": None,
    "status": 200,
    "end": "ok",
    "ttft_ms": 41.3,
    "tokens_in": 812,
    "tokens_out": 256,
    "tokens_source": "usage",
    "duration_ms": 1893.7,
    "method": "POST",
    "path": "/v1/chat/completions",
    "client": "10.1.2.3",
    "peer": None,
}
MESSAGE = "POST /v1/chat/completions 200"


class CountingFile(io.FileIO):
    """A raw file that counts its ``write`` calls (each a system call)."""

    writes = 0

    def write(self, data: Buffer, /) -> int:
        self.writes += 1
        return super().write(data)


def stderr_like() -> tuple[io.TextIOWrapper, CountingFile]:
    """A stream as ``sys.stderr`` is when not a terminal, over ``/dev/null``."""
    raw = CountingFile(os.devnull, "w")
    text = io.TextIOWrapper(io.BufferedWriter(raw), "utf-8", "backslashreplace", None, True)
    return text, raw


async def _write(writer: LineWriter, lines: int) -> None:
    for start in range(0, lines, BATCH):
        for _ in range(min(BATCH, lines - start)):
            writer.write(MESSAGE, FIELDS)
        await asyncio.sleep(0)  # the loop's iteration ends (requests finish per iteration)
    await asyncio.sleep(0)


def measure(log_format: LogFormat, lines: int) -> tuple[float, float, float]:
    """CPU µs per line written and per line formatted (best of five), and ``write``
    calls per line."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    stream, raw = stderr_like()
    configure("info", log_format, stream)
    writer = LineWriter(logging.getLogger("gtm.access.zone"))
    direct = writer.handler()
    if direct is None:
        raise SystemExit(f"LineWriter may not write: {writer.why_not()}")
    formatter = cast(TextFormatter | JsonFormatter, direct.formatter)
    best = formatting = float("inf")
    writes = 0
    for _ in range(5):
        raw.writes = 0
        start = time.process_time()
        asyncio.run(_write(writer, lines))
        direct.flush()  # what the run's interval left in the batch (a process's exit)
        best = min(best, (time.process_time() - start) / lines * 1e6)
        writes = raw.writes
        start = time.process_time()
        for _ in range(lines):
            formatter.info_line("gtm.access.zone", MESSAGE, FIELDS)
        formatting = min(formatting, (time.process_time() - start) / lines * 1e6)
    for handler in list(root.handlers):
        handler.flush()
        root.removeHandler(handler)
    stream.close()
    return best, formatting, writes / lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="5 × 400 lines per format (CI)")
    args = parser.parse_args()
    lines = 400 if args.smoke else 20_000
    print(
        f"{'format':6} {'µs/line':>8} {'formatting':>10} {'write(2)/line':>14}"
        f"   ({BATCH} lines per loop iteration)"
    )
    for log_format in LogFormat:
        us, formatting, writes = measure(log_format, lines)
        print(f"{log_format.value:6} {us:>8.2f} {formatting:>10.2f} {writes:>14.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

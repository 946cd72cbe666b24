"""The live line of ``gtm chaos run``: elapsed, phase, requests ok/failed, faults in force.

On a terminal the line is redrawn in place; otherwise (CI logs) a line is written every
:data:`LOG_EVERY_S` seconds and at each phase change, so logs stay short.
"""

from __future__ import annotations

import math
from typing import TextIO

from chaos.journal import FaultAction, Journal, Phase

LOG_EVERY_S = 10.0


def status_line(journal: Journal, now: float, phase: Phase, in_flight: int) -> str:
    ok = sum(1 for r in journal.requests if r.ok)
    failed = len(journal.requests) - ok
    active = active_faults(journal)
    return (
        f"{now:6.1f} s  {phase.value:<8}  ok {ok}  failed {failed}  in flight {in_flight}"
        f"  faults: {', '.join(active) if active else 'none'}"
    )


def active_faults(journal: Journal) -> list[str]:
    """Steps injected and not rolled back yet."""
    active: dict[str, str] = {}
    for record in journal.faults:
        if record.action is FaultAction.INJECT and not record.error:
            active[record.step] = f"{record.step} ({record.kind})"
        elif record.action is FaultAction.ROLLBACK:
            active.pop(record.step, None)
    return list(active.values())


class ProgressLine:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._last_at = -math.inf
        self._last_phase: Phase | None = None

    def update(self, journal: Journal, now: float, phase: Phase, in_flight: int) -> None:
        text = status_line(journal, now, phase, in_flight)
        if self._tty:
            self._stream.write("\r" + text[:160].ljust(100))
            self._stream.flush()
        elif now - self._last_at >= LOG_EVERY_S or phase is not self._last_phase:
            self._stream.write(text + "\n")
            self._stream.flush()
            self._last_at = now
        self._last_phase = phase

    def message(self, text: str) -> None:
        """A line of its own (the live line is redrawn after it)."""
        prefix = "\r" + " " * 100 + "\r" if self._tty else ""
        self._stream.write(prefix + text + "\n")
        self._stream.flush()

    def finish(self) -> None:
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()

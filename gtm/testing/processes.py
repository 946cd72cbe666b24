"""Start a ``gtm`` subcommand as a child process and wait until it listens — for
benchmarks and subprocess tests that run the real commands (``gtm gpu-sim``, ``gtm zone``
on loopback). One home: tests and benchmarks start, reach and stop children here, and
read what a process tree is and what CPU it used (Linux ``/proc``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gtm.errors import GtmError

#: How long a command gets to print its "listening on URL" line (a cold interpreter on a
#: loaded 2-core machine imports numpy, aiohttp and pydantic first).
STARTUP_TIMEOUT_S = 60.0
#: How long a stopped child gets after its signal before SIGKILL.
STOP_GRACE_S = 20.0
_LISTENING = re.compile(r"listening on (\S+)")


class StartError(GtmError):
    """A ``gtm`` child exited or printed something else before it listened."""


@dataclass
class GtmProcess:
    """A running ``gtm`` child, the URL it said it listens on, and the file its stderr
    goes to (None: discarded)."""

    proc: asyncio.subprocess.Process
    url: str
    log: Path | None = None

    async def stop(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Send ``signum`` (SIGINT: as Ctrl-C does), SIGKILL after ``STOP_GRACE_S``."""
        if self.proc.returncode is None:
            self.proc.send_signal(signum)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    def log_text(self) -> str:
        """What the child wrote to stderr so far ("" when it was discarded)."""
        return self.log.read_text() if self.log is not None and self.log.exists() else ""


async def start_listening(
    args: Sequence[str],
    *,
    timeout_s: float = STARTUP_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    log: Path | None = None,
) -> GtmProcess:
    """Run ``python -m gtmctl --log-level warning ARGS`` and wait for its first stdout
    line, which must say ``listening on URL``. ``env`` and ``cwd``: the child's (default:
    this process's), e.g. another checkout's tree first on ``PYTHONPATH``. ``log``: a
    file for the child's stderr (a file, not a pipe: a pipe nobody reads stalls a chatty
    child)."""
    with contextlib.ExitStack() as files:
        stderr = files.enter_context(log.open("wb")) if log is not None else None
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gtmctl",
            "--log-level",
            "warning",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL if stderr is None else stderr,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout_s)).decode()
    except TimeoutError:
        line = f"(nothing in {timeout_s:g} s)"
    match = _LISTENING.search(line)
    if match is None:
        proc.kill()
        await proc.wait()
        child = GtmProcess(proc, "", log)
        raise StartError(f"gtm {args[0]} did not start: {line!r}{child.log_text()[-4000:]}")
    return GtmProcess(proc, match.group(1), log)


@contextlib.asynccontextmanager
async def running(
    args: Sequence[str],
    *,
    timeout_s: float = STARTUP_TIMEOUT_S,
    log: Path | None = None,
    stop_signal: signal.Signals = signal.SIGTERM,
) -> AsyncIterator[GtmProcess]:
    """:func:`start_listening`, then :meth:`GtmProcess.stop` with ``stop_signal`` on the
    way out (also when the body raises)."""
    child = await start_listening(args, timeout_s=timeout_s, log=log)
    try:
        yield child
    finally:
        await child.stop(stop_signal)


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat``'s fields after the command name (which may hold spaces and
    parentheses): proc(5)'s field 3 (state) is ``[0]``, ppid ``[1]``, utime ``[11]``,
    stime ``[12]``. OSError: the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (every thread). OSError: the
    process is gone."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (:func:`descendants`)."""
    return [pid, *descendants(pid)]


def tree_cpu_seconds(pid: int) -> float:
    """:func:`cpu_seconds` of ``pid`` and its live descendants together (gpu-sim's
    renderer process, nginx's workers); a process gone in between counts nothing."""
    total = 0.0
    for each in tree(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(each)
    return total


def descendants(pid: int) -> list[int]:
    """The live processes started by ``pid``, their children, and so on (from /proc)."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in task.read_text().split()]
                found += kids
                pending += kids
    return found

"""Start a ``gtm`` subcommand as a child process and wait until it listens — for
benchmarks and subprocess tests that run the real commands."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gtm.errors import GtmError

#: How long a command gets to print its "listening on URL" line (a cold interpreter on a
#: loaded 2-core machine imports numpy, aiohttp and pydantic first).
STARTUP_TIMEOUT_S = 60.0
#: How long a stopped child gets after SIGTERM before SIGKILL.
STOP_GRACE_S = 20.0
_LISTENING = re.compile(r"listening on (\S+)")


class StartError(GtmError):
    """A ``gtm`` child exited or printed something else before it listened."""


@dataclass
class GtmProcess:
    """A running ``gtm`` child and the URL it said it listens on."""

    proc: asyncio.subprocess.Process
    url: str

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def start_listening(
    args: Sequence[str],
    *,
    timeout_s: float = STARTUP_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> GtmProcess:
    """Run ``python -m gtmctl --log-level warning ARGS`` and wait for its first stdout
    line, which must say ``listening on URL``. ``env`` and ``cwd``: the child's (default:
    this process's), e.g. another checkout's tree first on ``PYTHONPATH``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gtmctl",
        "--log-level",
        "warning",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
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
        raise StartError(f"gtm {args[0]} did not start: {line!r}")
    return GtmProcess(proc, match.group(1))

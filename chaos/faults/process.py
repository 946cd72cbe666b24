"""``kill`` (SIGKILL, held down until rollback) and ``pause`` (SIGSTOP / SIGCONT).

A kill first asks gtm up to *hold* the child (its supervisor would otherwise restart
it after a backoff of ~0.5 s), then sends SIGKILL and waits until the pid is gone;
rollback releases the hold, which restarts the child at once. A pause needs no hold:
a stopped process does not exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Literal

from chaos.deployment import Deployment
from chaos.faults.base import FaultError, Injected, SpecBase, TierName

#: How long a killed process may take to disappear (it is SIGKILLed: milliseconds).
GONE_WITHIN_S = 5.0
_POLL_S = 0.02


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``/proc/PID/stat``: R, S, T, Z…), or
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie is dead for our purposes)."""
    return proc_state(pid) not in (None, "Z", "X")


async def wait_state(pid: int, stopped: bool, limit_s: float = GONE_WITHIN_S) -> None:
    """Wait until ``pid`` is (or is no longer) stopped by a signal: a signal is
    delivered asynchronously, so ``kill`` returning does not mean it took effect."""
    deadline = time.monotonic() + limit_s
    while (proc_state(pid) == "T") != stopped and pid_alive(pid):
        if time.monotonic() > deadline:
            what = "stopped" if stopped else "running again"
            raise FaultError(f"pid {pid} is not {what} {limit_s:.0f} s after the signal")
        await asyncio.sleep(_POLL_S)


async def wait_down(
    deployment: Deployment, tier: str, pid: int, limit_s: float = GONE_WITHIN_S
) -> None:
    """Wait until gtm up's supervisor has seen ``tier`` (``pid``) exit: the process is
    gone and reaped, and the control API reports no pid for it."""
    deadline = time.monotonic() + limit_s
    while True:
        await deployment.refresh()
        if deployment.child(tier).pid != pid and not pid_alive(pid):
            return
        if time.monotonic() > deadline:
            raise FaultError(f"{tier} (pid {pid}) is still running {limit_s:.0f} s later")
        await asyncio.sleep(_POLL_S)


async def _live_pid(deployment: Deployment, tier: str) -> int:
    await deployment.refresh()
    child = deployment.child(tier)
    if child.pid is None:
        raise FaultError(f"{tier} is not running (it may be held down by another fault)")
    return child.pid


class KillFault(SpecBase):
    """SIGKILL a tier or GPU process and keep it down until rollback."""

    kind: Literal["kill"] = "kill"
    tier: TierName

    async def inject(self, deployment: Deployment) -> Injected:
        pid = await _live_pid(deployment, self.tier)
        await deployment.hold(self.tier)
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await wait_down(deployment, self.tier, pid)
        except BaseException:
            await deployment.release(self.tier)
            raise

        async def undo() -> None:
            await deployment.release(self.tier)

        return Injected(f"kill -9 {self.tier} (pid {pid}), held down", undo)


class PauseFault(SpecBase):
    """SIGSTOP a tier or GPU process; rollback sends SIGCONT."""

    kind: Literal["pause"] = "pause"
    tier: TierName

    async def inject(self, deployment: Deployment) -> Injected:
        pid = await _live_pid(deployment, self.tier)
        os.kill(pid, signal.SIGSTOP)
        try:
            await wait_state(pid, stopped=True)
        except BaseException:
            os.kill(pid, signal.SIGCONT)
            raise

        async def undo() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                await wait_state(pid, stopped=False)

        return Injected(f"SIGSTOP {self.tier} (pid {pid})", undo)

"""One fault, logged the way an operator reads it: once when it starts, counted while it
lasts, once when it ends.

Every loop that retries against something that can go away (the state store above
all: its watchers, publishers, leases and policy follower in every tier) fails on each
attempt while the thing is away. Logging each attempt — with a traceback — buried a
16-second etcd outage under tens of thousands of lines, the same few lines per process
and retry. An :class:`OutageLog` turns the attempts into:

* one WARNING line when the fault **starts**, naming what failed and why — without a
  traceback when the error is an expected fault (:data:`EXPECTED`: the store is
  unreachable, a lease expired, a connection or timeout error), with one when it is not
  (a bug must stay debuggable);
* the caller's Prometheus counter, incremented on **every** failed attempt (the log
  does not count, the metric does);
* one line when a *different* error type shows up during the same fault (its traceback
  once, if unexpected) — so a bug that starts while the store is away is not hidden;
* one WARNING line when the fault **ends**, with its duration and the number of failed
  attempts (the same level as the start, so a log filtered to warnings shows both).

Sans-io and synchronous: the caller passes in its clock and calls :meth:`failed` on an
attempt that failed and :meth:`recovered` on one that succeeded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gtm.clock import Clock
from gtm.errors import LeaseNotFound, StateUnavailable

#: Errors that are a fault of something else (the store, the network), not a bug: logged
#: without a traceback.
EXPECTED: tuple[type[BaseException], ...] = (
    StateUnavailable,
    LeaseNotFound,
    ConnectionError,
    TimeoutError,
)


def describe(exc: BaseException) -> str:
    """The error for a log line: its message, led by its type unless it is one of ours."""
    text = str(exc)
    if isinstance(exc, EXPECTED) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class OutageLog:
    """The log lines of one fault of ``what`` (e.g. ``"loop summary"``): see the module
    docstring. ``count`` is called on every failed attempt (a Prometheus counter's
    ``inc``); ``consequence`` says what the caller does meanwhile."""

    __slots__ = ("_attempts", "_clock", "_count", "_log", "_seen", "_since", "consequence", "what")

    def __init__(
        self,
        what: str,
        *,
        logger: logging.Logger,
        clock: Clock,
        count: Callable[[], None] | None = None,
        consequence: str = "retrying",
    ) -> None:
        self.what = what
        self.consequence = consequence
        self._log = logger
        self._clock = clock
        self._count = count
        self._since: float | None = None
        self._attempts = 0
        self._seen: set[type[BaseException]] = set()

    @property
    def active(self) -> bool:
        """Whether a fault is in progress (failed since the last success)."""
        return self._since is not None

    @property
    def attempts(self) -> int:
        """Failed attempts of the fault in progress (0 when none is)."""
        return self._attempts

    def failed(self, exc: BaseException) -> bool:
        """An attempt failed with ``exc``; ``True`` when this starts a fault."""
        started = self._since is None
        if started:
            self._since = self._clock.monotonic()
            self._attempts = 0
            self._seen.clear()
        self._attempts += 1
        if self._count is not None:
            self._count()
        kind = type(exc)
        if kind in self._seen:
            return started
        self._seen.add(kind)
        trace = None if isinstance(exc, EXPECTED) else exc
        if started:
            self._log.warning(
                "%s failed: %s; %s", self.what, describe(exc), self.consequence, exc_info=trace
            )
        else:
            self._log.warning("%s still failing, now: %s", self.what, describe(exc), exc_info=trace)
        return started

    def recovered(self) -> float | None:
        """An attempt succeeded; the fault's duration in seconds if one just ended."""
        since = self._since
        if since is None:
            return None
        duration = self._clock.monotonic() - since
        self._log.warning(
            "%s back after %.1f s (%d failed attempt%s)",
            self.what,
            duration,
            self._attempts,
            "" if self._attempts == 1 else "s",
        )
        self._since = None
        self._attempts = 0
        self._seen.clear()
        return duration


__all__ = ["EXPECTED", "OutageLog", "describe"]

"""The pieces of a toxic pipeline: chunks, bounded channels and stubs.

One direction of one connection (a *link*, :mod:`chaos.proxy.link`) is a chain::

    reader ─▶ Channel ─▶ Stub(hidden noop) ─▶ Channel ─▶ Stub(toxic 1) ─▶ … ─▶ Channel ─▶ writer

as in Toxiproxy (``link.go``, ``toxics/toxic.go``). Each stub runs its toxic's ``pipe``
as a task; a toxic reads chunks with :meth:`Stub.receive`, waits with :meth:`Stub.sleep`,
passes chunks on with :meth:`Stub.send` and ends the stream with :meth:`Stub.close`.

**Interrupts.** To add, update or remove a toxic on a live connection, the link
*interrupts* stubs (:meth:`Stub.interrupt`), rewires channels and restarts them. Every
wait a toxic can make (receive, sleep, send into a full channel) returns promptly when
interrupted, so re-piping never blocks the API. A chunk a toxic holds when interrupted
goes to the stub's *backlog* (:meth:`Stub.keep`; :meth:`Stub.send` does it itself), and
the backlog is delivered first when the stub restarts — or handed to the predecessor
when the stub is removed — so no data is dropped or reordered. Go's ``WriteOutput`` on
interrupt flushes the same chunk; we defer it instead of blocking.

**End of stream.** :data:`EOF` travels through channels like a chunk and is *sticky*
(once a channel has yielded it, it yields it forever), mirroring a closed Go channel,
so a toxic restarted after consuming EOF sees it again. A closed stub discards what
reaches it, as nothing downstream will carry it.

**Time.** Chunks are timestamped with the injected :class:`~gtm.clock.Clock`; timed
waits are ``clock.sleep`` tasks that wake the stub, so unit tests drive toxics with a
``FakeClock``.

Everything here runs on one event loop: a state change between two awaits is atomic.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gtm.clock import Clock

if TYPE_CHECKING:
    from chaos.proxy.toxics.base import Toxic

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One ``read()`` result and when it was received (``clock.monotonic()`` seconds)."""

    data: bytes
    timestamp: float


class Signal(Enum):
    """What a wait can return besides a chunk."""

    EOF = "eof"
    INTERRUPTED = "interrupted"
    TIMED_OUT = "timed out"


EOF: Literal[Signal.EOF] = Signal.EOF
Item = Chunk | Literal[Signal.EOF]

#: Starts a coroutine as a task of the connection, or returns None if the connection is
#: being torn down (then the coroutine is closed, never run).
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None] | None"]


class StageConfig(Protocol):
    """What a stub reads from its toxic's configuration each time it (re)starts."""

    @property
    def toxic(self) -> Toxic: ...

    @property
    def toxicity(self) -> float: ...


class Parker:
    """Something that waits for one thing at a time and can be woken.

    Wake-ups may be spurious: whoever parks re-checks its condition in a loop.
    """

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def park(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None


class Channel:
    """A bounded FIFO between one producer and one consumer, like a Go channel.

    ``capacity`` is the toxic's buffer (Toxiproxy: 1024 for latency, unbuffered for the
    rest; we use at least 1). Producers call :meth:`offer` and park while it returns
    False; consumers :meth:`poll` and park while it returns None.
    """

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = max(1, capacity)
        self.producer: Parker | None = None
        self.consumer: Parker | None = None
        self._items: deque[Item] = deque()
        self._eof_seen = False
        self._discarding = False

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: Item) -> bool:
        """Enqueue ``item`` if there is room (always "succeeds" once discarding)."""
        if self._discarding:
            return True
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        if self.consumer is not None:
            self.consumer.wake()
        return True

    def poll(self) -> Item | None:
        """The next item, EOF forever once EOF was taken, or None if empty."""
        if self._eof_seen:
            return EOF
        if not self._items:
            return None
        item = self._items.popleft()
        if item is EOF:
            self._eof_seen = True
        if self.producer is not None:
            self.producer.wake()
        return item

    def take_all(self) -> list[Item]:
        """Remove and return everything queued (used when a stage is removed)."""
        items = list(self._items)
        self._items.clear()
        if self.producer is not None:
            self.producer.wake()
        return items

    def discard(self) -> None:
        """Drop what is queued and accept-and-drop everything from now on."""
        self._discarding = True
        self._items.clear()
        if self.producer is not None:
            self.producer.wake()


class _Timer:
    """A ``clock.sleep`` running as a task that wakes ``parker`` when it elapses."""

    def __init__(self, clock: Clock, seconds: float, parker: Parker, spawn: Spawn) -> None:
        self.fired = False
        self._task = spawn(self._run(clock, seconds, parker))

    async def _run(self, clock: Clock, seconds: float, parker: Parker) -> None:
        await clock.sleep(seconds)
        self.fired = True
        parker.wake()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


class Stub(Parker):
    """One stage of a link: runs a toxic between its inbox and its output channel."""

    def __init__(
        self,
        config: StageConfig | None,
        *,
        inbox: Channel,
        output: Channel,
        clock: Clock,
        rng: random.Random,
        spawn: Spawn,
    ) -> None:
        super().__init__()
        self.config = config
        self.clock = clock
        self.rng = rng
        self.inbox = inbox
        inbox.consumer = self
        self._output = output
        output.producer = self
        self._spawn = spawn
        self.backlog: deque[Item] = deque()
        #: Per-connection state of a stateful toxic (limit_data's byte count). Created
        #: once with the stub and kept across updates, like ``StatefulToxic.NewState``.
        self.state: object | None = config.toxic.new_state() if config is not None else None
        self._interrupt = False
        self._closing = False
        self._closed = False
        self._pipe_done: asyncio.Future[None] | None = None

    @property
    def output(self) -> Channel:
        return self._output

    @output.setter
    def output(self, channel: Channel) -> None:
        self._output = channel
        channel.producer = self

    @property
    def closed(self) -> bool:
        """Closed, or committed to close (reset_peer's sleep): no longer re-pipeable."""
        return self._closed or self._closing

    @property
    def running(self) -> bool:
        return self._pipe_done is not None

    @property
    def interrupted(self) -> bool:
        return self._interrupt

    # ------------------------------------------------------------------ for toxics
    async def receive(self, within: float | None = None) -> Chunk | Signal:
        """The next chunk, EOF, INTERRUPTED, or TIMED_OUT if nothing came ``within`` s."""
        timer = None if within is None else _Timer(self.clock, within, self, self._spawn)
        try:
            while True:
                if self._interrupt:
                    return Signal.INTERRUPTED
                item = self.inbox.poll()
                if item is not None:
                    return item
                if timer is not None and timer.fired:
                    return Signal.TIMED_OUT
                await self.park()
        finally:
            if timer is not None:
                timer.cancel()

    async def send(self, item: Item) -> bool:
        """Pass ``item`` on; False if interrupted first (then it waits in the backlog)."""
        if self._output.offer(item):
            return True
        while True:
            if self._interrupt:
                self.backlog.append(item)
                return False
            await self.park()
            if self._output.offer(item):
                return True

    async def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` on the clock; False if interrupted first."""
        if self._interrupt:
            return False
        if seconds <= 0:
            return True
        timer = _Timer(self.clock, seconds, self, self._spawn)
        try:
            while not timer.fired:
                if self._interrupt:
                    return False
                await self.park()
            return True
        finally:
            timer.cancel()

    async def wait_for_interrupt(self) -> None:
        """Hold everything until the toxic is interrupted (a stalled stream)."""
        while not self._interrupt:
            await self.park()

    def keep(self, item: Item) -> None:
        """Hold ``item`` for delivery when the stub restarts (or its successor takes over)."""
        self.backlog.append(item)

    def commit_to_close(self) -> None:
        """Promise to close soon: from now on interrupts do not wait for this stub.

        reset_peer's sleep cannot be interrupted in Toxiproxy, so a toxic change waits it
        out and then finds the stub closed. Committing first gives the same outcome
        without holding the API call for the whole sleep.
        """
        self._closing = True

    def close(self) -> None:
        """End the stream here: EOF goes downstream after the backlog; inputs are dropped."""
        if self._closed:
            return
        self._closed = True
        self._closing = True
        self.inbox.discard()
        self.backlog.append(EOF)
        if not self.running:
            self._spawn(self._drain_backlog())

    # ------------------------------------------------------------------ for links
    def start(self, *, force_noop: bool = False) -> None:
        """(Re)start the toxic, re-rolling toxicity like ``ToxicStub.Run``."""
        if self.running or self.closed:
            return
        toxic = self._pick_toxic(force_noop)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pipe_done = done
        if self._spawn(self._run(toxic)) is None:
            self._pipe_done = None
            self._closed = True

    async def interrupt(self) -> bool:
        """Stop the running toxic; True if the stub is stopped and can be rewired."""
        if self.closed:
            return False
        done = self._pipe_done
        if done is None:
            return True
        self._interrupt = True
        self.wake()
        try:
            await asyncio.shield(done)
        finally:
            self._interrupt = False
        return not self.closed

    def _pick_toxic(self, force_noop: bool) -> Toxic:
        from chaos.proxy.toxics.noop import NOOP

        config = self.config
        if force_noop or config is None:
            return NOOP
        # Toxiproxy: ``rand.Float32() < toxicity``, drawn each time the stub (re)starts.
        return config.toxic if self.rng.random() < config.toxicity else NOOP

    async def _run(self, toxic: Toxic) -> None:
        try:
            if await self._flush_backlog():
                await toxic.pipe(self)
        finally:
            done, self._pipe_done = self._pipe_done, None
            if done is not None and not done.done():
                done.set_result(None)
        if self._closed:
            await self._drain_backlog()

    async def _flush_backlog(self) -> bool:
        """Deliver held items in order; False if interrupted or the stream ended."""
        while self.backlog:
            if self._output.offer(self.backlog[0]):
                if self.backlog.popleft() is EOF:
                    self._closed = self._closing = True
                    self.inbox.discard()
                    return False
                continue
            if self._interrupt:
                return False
            await self.park()
        return True

    async def _drain_backlog(self) -> None:
        """After close: deliver the rest and EOF, uninterruptibly."""
        while self.backlog:
            if self._output.offer(self.backlog[0]):
                self.backlog.popleft()
            else:
                await self.park()

"""A link: one direction of one proxied connection, pumped through a toxic chain.

``upstream`` links carry client → server bytes, ``downstream`` links server → client
(Toxiproxy README). A link reads its source in chunks of up to 32 KiB (the buffer of Go's
``io.Copy``), passes them through its stubs and writes them to its sink. At end of
stream the writer *closes* the sink — no half-close: Toxiproxy calls ``Close()``, not
``CloseWrite()`` (``link.go``), and closing one socket ends the other direction's read,
so the whole connection winds down, delivering what is already in flight.

Toxic changes on live links follow ``link.go`` (``AddToxic``, ``UpdateToxic``,
``RemoveToxic``): add appends a stage after interrupting the last one; update restarts
the stage (re-rolling toxicity); remove splices the stage out, handing its held and
queued chunks to its predecessor so nothing is lost, except for toxics that close the
connection on removal (``timeout``). See :mod:`chaos.proxy.pipe` for interrupts.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from chaos.proxy.models import Direction
from chaos.proxy.pipe import EOF, Channel, Chunk, Parker, StageConfig, Stub
from gtm.clock import Clock

#: Read size per chunk: Go's ``io.Copy`` buffer, 32 KiB.
READ_SIZE = 32 * 1024


class ByteSource(Protocol):
    """Where a link reads from (``asyncio.StreamReader`` fits)."""

    async def read(self, n: int = -1) -> bytes: ...


class ByteSink(Protocol):
    """Where a link writes to (``asyncio.StreamWriter`` fits)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class LinkMeter(Protocol):
    """Byte accounting of a link (metrics)."""

    def received(self, direction: Direction, size: int) -> None: ...

    def sent(self, direction: Direction, size: int) -> None: ...

    def finished(self, direction: Direction, received: int, sent: int) -> None: ...


class NullMeter:
    def received(self, direction: Direction, size: int) -> None:
        pass

    def sent(self, direction: Direction, size: int) -> None:
        pass

    def finished(self, direction: Direction, received: int, sent: int) -> None:
        pass


TaskFactory = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class Link:
    """One direction of a connection: reader → hidden noop → toxics → writer."""

    def __init__(
        self,
        direction: Direction,
        source: ByteSource,
        sink: ByteSink,
        *,
        clock: Clock,
        rng: random.Random,
        task_factory: TaskFactory,
        meter: LinkMeter | None = None,
    ) -> None:
        self.direction = direction
        self._source = source
        self._sink = sink
        self._clock = clock
        self._rng = rng
        self._task_factory = task_factory
        self._meter = meter or NullMeter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._aborted = False
        self._stubs: list[Stub] = []
        self._reader = Parker()
        self._writer = Parker()
        self._received = 0
        self._sent = 0
        #: Set when the writer has finished (end of stream delivered, or the sink broke).
        self.finished = asyncio.Event()

    @property
    def stubs(self) -> tuple[Stub, ...]:
        return tuple(self._stubs)

    @property
    def alive(self) -> bool:
        return not self._aborted and not self.finished.is_set()

    # ------------------------------------------------------------------ lifecycle
    def start(self, chain: Sequence[StageConfig]) -> None:
        """Build the stubs for ``chain`` (toxics in creation order) and start pumping."""
        head = Channel()
        head.producer = self._reader
        out = Channel()
        out.consumer = self._writer
        inboxes = [head] + [Channel(config.toxic.buffer_size) for config in chain]
        outputs = [*inboxes[1:], out]
        configs: list[StageConfig | None] = [None, *chain]
        self._stubs = [
            Stub(
                config,
                inbox=inbox,
                output=output,
                clock=self._clock,
                rng=self._rng,
                spawn=self._spawn,
            )
            for config, inbox, output in zip(configs, inboxes, outputs, strict=True)
        ]
        self._spawn(self._read(head))
        self._spawn(self._write(out))
        for stub in self._stubs:
            stub.start()

    def abort(self) -> None:
        """Stop everything now (proxy stopped or connection torn down)."""
        self._aborted = True
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        if self._aborted:
            coro.close()
            return None
        try:
            task = self._task_factory(coro)
        except RuntimeError:  # the connection's task group is shutting down
            coro.close()
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _read(self, channel: Channel) -> None:
        while True:
            try:
                data = await self._source.read(READ_SIZE)
            except (ConnectionError, OSError):
                data = b""
            item = Chunk(data, self._clock.monotonic()) if data else EOF
            while not channel.offer(item):
                await self._reader.park()
            if item is EOF:
                return
            self._received += len(data)
            self._meter.received(self.direction, len(data))

    async def _write(self, channel: Channel) -> None:
        try:
            while True:
                item = channel.poll()
                if item is None:
                    await self._writer.park()
                    continue
                if item is EOF:
                    return
                if item.data:
                    self._sink.write(item.data)
                    await self._sink.drain()
                    self._sent += len(item.data)
                    self._meter.sent(self.direction, len(item.data))
        except (ConnectionError, OSError):
            return
        finally:
            channel.discard()
            self._sink.close()
            self._meter.finished(self.direction, self._received, self._sent)
            self.finished.set()

    # ------------------------------------------------------------------ live changes
    async def add_toxic(self, config: StageConfig) -> None:
        """Append a stage for ``config`` at the end of the chain."""
        if not self.alive:
            return
        last = self._stubs[-1]
        try:
            if not await last.interrupt() or not self.alive:
                return  # the stream is ending; Toxiproxy drops the new stage too
            inbox = Channel(config.toxic.buffer_size)
            stub = Stub(
                config,
                inbox=inbox,
                output=last.output,
                clock=self._clock,
                rng=self._rng,
                spawn=self._spawn,
            )
            last.output = inbox
            self._stubs.append(stub)
        finally:
            self._restart_stopped()

    async def update_toxic(self, config: StageConfig) -> None:
        """Restart the stage of ``config`` so it runs the new settings (re-rolls)."""
        stub = self._find(config)
        if stub is None or not self.alive:
            return
        try:
            await stub.interrupt()
        finally:
            self._restart_stopped()

    async def remove_toxic(self, config: StageConfig) -> None:
        """Splice the stage of ``config`` out of the chain."""
        stub = self._find(config)
        if stub is None or not self.alive:
            return
        try:
            if not await stub.interrupt() or not self.alive:
                return
            if config.toxic.closes_on_removal:
                stub.close()
                return
            index = self._stubs.index(stub)
            previous = self._stubs[index - 1]
            if not await previous.interrupt():
                # The predecessor already ended the stream: let this stage pass the
                # rest through (Toxiproxy keeps draining it until EOF).
                stub.start(force_noop=True)
                return
            previous.backlog.extendleft(reversed([*stub.backlog, *stub.inbox.take_all()]))
            stub.backlog.clear()
            previous.output = stub.output
            del self._stubs[index]
        finally:
            self._restart_stopped()

    def _find(self, config: StageConfig) -> Stub | None:
        return next((stub for stub in self._stubs if stub.config is config), None)

    def _restart_stopped(self) -> None:
        """(Re)start every stage that is stopped — also if a change was cancelled."""
        if not self.alive:
            return
        for stub in self._stubs:
            stub.start()

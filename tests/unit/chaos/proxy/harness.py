"""Drive a link in memory: a source the test feeds, a sink that records when bytes and
the close arrived on the injected clock, and the toxic collection that re-pipes it."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from chaos.proxy.collection import ToxicCollection, ToxicSlot
from chaos.proxy.link import Link
from chaos.proxy.models import Direction
from chaos.proxy.toxics.base import Toxic
from gtm.clock import Clock, FakeClock


class MemorySource:
    """A ByteSource: each ``feed`` is returned by one ``read``; b"" after ``feed_eof``."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._eof = False
        self._ready = asyncio.Event()

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._ready.set()

    def feed_eof(self) -> None:
        self._eof = True
        self._ready.set()

    async def read(self, n: int = -1) -> bytes:
        while not self._chunks and not self._eof:
            self._ready.clear()
            await self._ready.wait()
        return self._chunks.popleft() if self._chunks else b""


class MemorySink:
    """A ByteSink recording ``(clock time, bytes)`` per write and when it was closed."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.writes: list[tuple[float, bytes]] = []
        self.closed_at: float | None = None

    def write(self, data: bytes) -> None:
        self.writes.append((self._clock.monotonic(), bytes(data)))

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = self._clock.monotonic()

    @property
    def data(self) -> bytes:
        return b"".join(chunk for _, chunk in self.writes)

    @property
    def closed(self) -> bool:
        return self.closed_at is not None


def slot(
    toxic: Toxic,
    *,
    name: str | None = None,
    direction: Direction = Direction.DOWNSTREAM,
    toxicity: float = 1.0,
) -> ToxicSlot:
    return ToxicSlot(
        name=name or f"{toxic.type_name}_{direction.value}",
        type=toxic.type_name,
        stream=direction.value,
        direction=direction,
        toxicity=toxicity,
        toxic=toxic,
    )


@dataclass
class Harness:
    link: Link
    source: MemorySource
    sink: MemorySink
    toxics: ToxicCollection
    clock: FakeClock

    async def settle(self) -> None:
        await self.clock.settle(rounds=30)

    async def feed(self, data: bytes) -> None:
        self.source.feed(data)
        await self.settle()

    async def eof(self) -> None:
        self.source.feed_eof()
        await self.settle()

    async def advance(self, seconds: float) -> None:
        await self.clock.advance(seconds)
        await self.settle()

    async def advance_finely(self, seconds: float, step: float = 0.001) -> None:
        """Advance in small steps, so timers started by woken stages fire on time.

        ``FakeClock.advance`` wakes the sleepers registered when it starts; a stage that
        wakes, passes a chunk on and starts its next timer registers it too late for the
        same call. Stepping lets every stage reach its next sleep in between.
        """
        for _ in range(round(seconds / step)):
            await self.advance(step)


@asynccontextmanager
async def running_link(
    clock: FakeClock,
    chain: Sequence[ToxicSlot] = (),
    *,
    seed: int = 1,
    rng: random.Random | None = None,
    direction: Direction = Direction.DOWNSTREAM,
) -> AsyncIterator[Harness]:
    source = MemorySource()
    sink = MemorySink(clock)
    toxics = ToxicCollection()
    failure: Exception | None = None
    for item in chain:
        await toxics.add(item)
    async with asyncio.TaskGroup() as group:
        link = Link(
            direction,
            source,
            sink,
            clock=clock,
            rng=rng or random.Random(seed),
            task_factory=group.create_task,
        )
        toxics.attach(link)
        harness = Harness(link, source, sink, toxics, clock)
        try:
            await harness.settle()
            yield harness
        except Exception as exc:  # re-raised below, unwrapped by the task group
            failure = exc
        finally:
            toxics.detach(link)
            link.abort()
    if failure is not None:
        raise failure

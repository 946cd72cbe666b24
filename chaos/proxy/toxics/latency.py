"""``latency``: delays every chunk by ``latency`` ± ``jitter`` milliseconds.

Each chunk is released at *receipt* + latency + U[-jitter, +jitter) ms
(``rand.Int63n(2j) - j`` in ``toxics/latency.go``); chunks are processed in order, so a
delay never reorders data and a chunk that waited in the buffer is not delayed twice. A
negative effective delay is no delay. The released chunk is stamped with its due time,
so stacked latency toxics add up. When interrupted (removed or updated) the held chunk
is released at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.proxy.models import GoInt64
from chaos.proxy.pipe import EOF, Chunk, Signal
from chaos.proxy.toxics.base import Toxic, ms

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


class LatencyToxic(Toxic):
    type_name = "latency"
    # Toxiproxy buffers 1024 chunks in front of a latency toxic (GetBufferSize) so the
    # reader keeps timestamping chunks while earlier ones wait.
    buffer_size = 1024

    latency: GoInt64 = 0
    jitter: GoInt64 = 0

    def delay_ms(self, stub: Stub) -> int:
        delay = self.latency
        if self.jitter > 0:
            delay += stub.rng.randrange(2 * self.jitter) - self.jitter
        return delay

    async def pipe(self, stub: Stub) -> None:
        while True:
            item = await stub.receive()
            if item is EOF:
                stub.close()
                return
            if isinstance(item, Signal):
                return
            due = item.timestamp + ms(self.delay_ms(stub))
            if not await stub.sleep(due - stub.clock.monotonic()):
                stub.keep(item)
                return
            if not await stub.send(Chunk(item.data, max(due, item.timestamp))):
                return

"""``bandwidth``: limits a direction to ``rate`` KB/s (1 KB = 1000 bytes).

Follows ``toxics/bandwidth.go``: the rate is bytes per millisecond; each chunk adds
``len/rate`` ms to a sleep debt; chunks larger than ``rate*100`` bytes are cut into
slices released every 100 ms; the debt carries the timer's lateness into the next
chunk. ``rate <= 0`` stalls the stream (the reference loops forever emitting empty
slices) until the toxic is removed or updated — a "half-open" connection (issue #210).
On interrupt the unsent rest of the chunk is kept, not dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.proxy.models import GoInt64
from chaos.proxy.pipe import EOF, Chunk, Signal
from chaos.proxy.toxics.base import Toxic

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub

#: Slice period of the reference implementation: 100 ms.
SLICE_SECONDS = 0.1


class BandwidthToxic(Toxic):
    type_name = "bandwidth"

    rate: GoInt64 = 0

    async def pipe(self, stub: Stub) -> None:
        debt = 0.0  # seconds still owed, may go negative (timer lateness)
        while True:
            item = await stub.receive()
            if item is EOF:
                stub.close()
                return
            if isinstance(item, Signal):
                return
            if self.rate <= 0:
                await stub.wait_for_interrupt()
                stub.keep(item)
                return
            debt += len(item.data) / self.rate / 1000.0
            rest = await self._send_slices(stub, item, debt)
            if rest is None:
                return
            debt, item = rest
            start = stub.clock.monotonic()
            if not await stub.sleep(debt):
                stub.keep(item)
                return
            debt -= stub.clock.monotonic() - start
            if not await stub.send(item):
                return

    async def _send_slices(
        self, stub: Stub, item: Chunk, debt: float
    ) -> tuple[float, Chunk] | None:
        """Emit ``rate*100``-byte slices every 100 ms; the rest and the debt left."""
        size = self.rate * 100
        while len(item.data) > size:
            if not await stub.sleep(SLICE_SECONDS):
                stub.keep(item)
                return None
            head, item = (
                Chunk(item.data[:size], item.timestamp),
                Chunk(item.data[size:], item.timestamp),
            )
            debt -= SLICE_SECONDS
            if not await stub.send(head):
                stub.keep(item)
                return None
        return debt, item

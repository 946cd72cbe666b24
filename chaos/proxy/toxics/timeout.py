"""``timeout``: drops all data in its direction; with ``timeout > 0`` it closes the
connection after ``timeout`` ms *without incoming chunks* (each dropped chunk re-arms
the timer, as ``time.After`` inside the select loop of ``toxics/timeout.go`` does);
with ``timeout <= 0`` it black-holes forever. Removing it closes the connections it ran
on (``Cleanup``, PR #168)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.proxy.models import GoInt64
from chaos.proxy.pipe import EOF, Signal
from chaos.proxy.toxics.base import Toxic, ms

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


class TimeoutToxic(Toxic):
    type_name = "timeout"
    closes_on_removal = True

    timeout: GoInt64 = 0

    async def pipe(self, stub: Stub) -> None:
        limit = ms(self.timeout) if self.timeout > 0 else None
        while True:
            item = await stub.receive(within=limit)
            if item is EOF or item is Signal.TIMED_OUT:
                stub.close()
                return
            if item is Signal.INTERRUPTED:
                return
            # A chunk: dropped on the floor.

"""``noop``: passes data through unchanged. Also the hidden first stage of every chain,
and what a stub runs when its toxicity roll fails (``toxics/noop.go``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.proxy.pipe import EOF, Signal
from chaos.proxy.toxics.base import Toxic

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


class NoopToxic(Toxic):
    type_name = "noop"

    async def pipe(self, stub: Stub) -> None:
        while True:
            item = await stub.receive()
            if item is Signal.INTERRUPTED:
                return
            if item is EOF:
                stub.close()
                return
            if isinstance(item, Signal) or not await stub.send(item):
                return


NOOP = NoopToxic()

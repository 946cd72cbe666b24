"""``slow_close``: data passes unchanged; at end of stream, wait ``delay`` ms before
closing (``toxics/slow_close.go``). Interrupted during the wait, it closes nothing: the
restarted stage sees the end of stream again (EOF is sticky)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.proxy.models import GoInt64
from chaos.proxy.pipe import EOF, Signal
from chaos.proxy.toxics.base import Toxic, ms

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


class SlowCloseToxic(Toxic):
    type_name = "slow_close"

    delay: GoInt64 = 0

    async def pipe(self, stub: Stub) -> None:
        while True:
            item = await stub.receive()
            if item is EOF:
                if await stub.sleep(ms(self.delay)):
                    stub.close()
                return
            if isinstance(item, Signal) or not await stub.send(item):
                return

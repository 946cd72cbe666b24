"""``limit_data``: lets ``bytes`` bytes through per connection and direction, then
closes. The chunk that crosses the limit is truncated. The count survives updates of
the toxic (``StatefulToxic`` in ``toxics/limit_data.go``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaos.proxy.models import GoInt64
from chaos.proxy.pipe import EOF, Chunk, Signal
from chaos.proxy.toxics.base import Toxic

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


@dataclass(slots=True)
class LimitDataState:
    transmitted: int = 0


class LimitDataToxic(Toxic):
    type_name = "limit_data"

    bytes: GoInt64 = 0

    def new_state(self) -> LimitDataState:
        return LimitDataState()

    async def pipe(self, stub: Stub) -> None:
        state = stub.state
        if not isinstance(state, LimitDataState):
            raise TypeError("limit_data stub without its state")
        while True:
            item = await stub.receive()
            if item is EOF:
                stub.close()
                return
            if isinstance(item, Signal):
                return
            remaining = max(0, self.bytes - state.transmitted)
            data = item.data[:remaining]
            sent = True
            if data:
                sent = await stub.send(Chunk(data, item.timestamp))
                state.transmitted += len(data)
            if self.bytes - state.transmitted <= 0:
                stub.close()
                return
            if not sent:
                return

"""``slicer``: cuts each chunk into pieces of about ``average_size`` ± ``size_variation``
bytes, emitted ``delay`` microseconds apart (``toxics/slicer.go``).

A chunk is split at its midpoint ± ``rand(size_variation)`` recursively until every piece
is at most ``average_size + size_variation`` bytes. The reference recurses without end
for ``average_size: 0`` and slices out of bounds when ``size_variation`` exceeds the
average; we refuse ``average_size < 1`` and keep every split point inside the chunk, so
any other values are safe. On interrupt the unsent rest goes on in one piece.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from pydantic import model_validator

from chaos.proxy.models import GoInt64
from chaos.proxy.pipe import EOF, Chunk, Signal
from chaos.proxy.toxics.base import Toxic

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


class SlicerToxic(Toxic):
    type_name = "slicer"

    average_size: GoInt64 = 0
    size_variation: GoInt64 = 0
    delay: GoInt64 = 0

    @model_validator(mode="after")
    def _positive_average(self) -> SlicerToxic:
        if self.average_size < 1:
            raise ValueError(
                "slicer average_size must be at least 1 (0 never terminates in Toxiproxy)"
            )
        return self

    def split_points(self, size: int, rng: random.Random) -> list[tuple[int, int]]:
        """``[(start, end), …]`` covering ``[0, size)`` in order."""
        limit = max(1, self.average_size + self.size_variation)
        pieces: list[tuple[int, int]] = []
        stack = [(0, size)]
        while stack:
            start, end = stack.pop()
            if end - start <= limit:
                pieces.append((start, end))
                continue
            mid = start + (end - start) // 2
            if self.size_variation > 0:
                mid += rng.randrange(2 * self.size_variation) - self.size_variation
            mid = min(max(mid, start + 1), end - 1)
            stack.append((mid, end))
            stack.append((start, mid))
        return pieces

    async def pipe(self, stub: Stub) -> None:
        while True:
            item = await stub.receive()
            if item is EOF:
                stub.close()
                return
            if isinstance(item, Signal):
                return
            if not await self._emit(stub, item):
                return

    async def _emit(self, stub: Stub, item: Chunk) -> bool:
        for start, end in self.split_points(len(item.data), stub.rng):
            rest = Chunk(item.data[end:], item.timestamp)
            sent = await stub.send(Chunk(item.data[start:end], item.timestamp))
            # Like the reference, wait ``delay`` after every piece, the last one too.
            if not sent or not await stub.sleep(self.delay / 1_000_000):
                if rest.data:
                    stub.keep(rest)
                return False
        return True

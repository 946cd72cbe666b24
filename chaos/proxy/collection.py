"""The toxics of one proxy: two ordered chains and the live links they apply to.

As in ``toxic_collection.go``: names are unique across both streams; the list shows the
upstream chain first, then the downstream one, each in creation order; a change is
applied to the chain first and then to every live link of that direction, and returns
once all of them have been re-piped. New links are built from the chain as it is when
they start, so a link never misses or doubles a change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from chaos.proxy.link import Link
from chaos.proxy.models import Direction, ToxicView
from chaos.proxy.toxics.base import Toxic


@dataclass(eq=False, slots=True)
class ToxicSlot:
    """One configured toxic. Identity matters: links find their stage by this object.

    ``toxic`` and ``toxicity`` change on update; the rest is fixed at creation.
    """

    name: str
    type: str
    stream: str  # as the client sent it (parsing is case-insensitive)
    direction: Direction
    toxicity: float
    toxic: Toxic

    def view(self) -> ToxicView:
        return ToxicView(
            attributes=self.toxic.attributes(),
            name=self.name,
            type=self.type,
            stream=self.stream,
            toxicity=self.toxicity,
        )


class ToxicCollection:
    """Chains per direction plus the registry of live links of one proxy."""

    def __init__(self, on_change: Callable[[Direction, int], None] | None = None) -> None:
        self._chains: dict[Direction, list[ToxicSlot]] = {d: [] for d in Direction}
        self._links: dict[Direction, set[Link]] = {d: set() for d in Direction}
        self._on_change = on_change

    def slots(self) -> list[ToxicSlot]:
        return [*self._chains[Direction.UPSTREAM], *self._chains[Direction.DOWNSTREAM]]

    def views(self) -> tuple[ToxicView, ...]:
        return tuple(slot.view() for slot in self.slots())

    def get(self, name: str) -> ToxicSlot | None:
        return next((slot for slot in self.slots() if slot.name == name), None)

    def chain(self, direction: Direction) -> tuple[ToxicSlot, ...]:
        return tuple(self._chains[direction])

    def resets_peer(self) -> bool:
        """Is a reset_peer toxic in either chain (decides SO_LINGER 0 at accept)?"""
        return any(slot.toxic.resets_peer for slot in self.slots())

    # ------------------------------------------------------------------ links
    def attach(self, link: Link) -> None:
        """Register ``link`` and start it with the current chain (one atomic step)."""
        self._links[link.direction].add(link)
        link.start(self.chain(link.direction))

    def detach(self, link: Link) -> None:
        self._links[link.direction].discard(link)

    # ------------------------------------------------------------------ changes
    async def add(self, slot: ToxicSlot) -> None:
        self._chains[slot.direction].append(slot)
        self._changed(slot.direction)
        await self._each_link(slot.direction, lambda link: link.add_toxic(slot))

    async def update(self, slot: ToxicSlot, *, toxic: Toxic, toxicity: float) -> None:
        slot.toxic = toxic
        slot.toxicity = toxicity
        await self._each_link(slot.direction, lambda link: link.update_toxic(slot))

    async def remove(self, slot: ToxicSlot) -> None:
        self._chains[slot.direction].remove(slot)
        self._changed(slot.direction)
        await self._each_link(slot.direction, lambda link: link.remove_toxic(slot))

    async def reset(self) -> None:
        """Remove every toxic, front to back (``ResetToxics``)."""
        for slot in self.slots():
            await self.remove(slot)

    async def _each_link(
        self, direction: Direction, change: Callable[[Link], Coroutine[Any, Any, None]]
    ) -> None:
        links = list(self._links[direction])
        if links:
            await asyncio.gather(*(change(link) for link in links))

    def _changed(self, direction: Direction) -> None:
        if self._on_change is not None:
            self._on_change(direction, len(self._chains[direction]))

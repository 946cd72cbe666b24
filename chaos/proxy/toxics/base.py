"""What every toxic is: a frozen, strictly validated set of attributes plus a ``pipe``.

The attributes are the toxic's JSON ``attributes`` object (every one always serialised,
zero values included, as Toxiproxy does); ``pipe`` moves chunks through one stub of one
connection until the stream ends or the stub is interrupted (``toxics/toxic.go``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


class Toxic(BaseModel):
    """Base class of the toxics. Subclasses set ``type_name`` and implement ``pipe``."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    #: The ``type`` clients use to create it.
    type_name: ClassVar[str] = ""
    #: Capacity of the stub's inbox (Toxiproxy ``BufferedToxic``; latency buffers 1024).
    buffer_size: ClassVar[int] = 1
    #: Removing the toxic closes the connections it runs on (``CleanupToxic``: timeout).
    closes_on_removal: ClassVar[bool] = False
    #: Connections accepted while it is in a chain get SO_LINGER 0 so close sends RST.
    resets_peer: ClassVar[bool] = False

    def new_state(self) -> object | None:
        """Per-connection state kept across updates (``StatefulToxic``), if any."""
        return None

    def attributes(self) -> dict[str, int]:
        return {name: int(value) for name, value in self.model_dump().items()}

    async def pipe(self, stub: Stub) -> None:
        raise NotImplementedError


def ms(milliseconds: int) -> float:
    """Toxiproxy attributes are milliseconds; the clock counts seconds."""
    return milliseconds / 1000.0

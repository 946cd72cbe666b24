"""``reset_peer``: on the first chunk *or* end of stream after it starts, drop it, wait
``timeout`` ms, then close — with a TCP RST when SO_LINGER 0 was set, which happens only
if the toxic was in the chain when the connection was accepted (``link.go``); added to
an open connection it closes with a plain FIN. An idle connection is never reset.

The wait cannot be interrupted in Toxiproxy (``toxics/reset_peer.go``); we commit to the
close before waiting so that a toxic change does not block on it (same outcome).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.proxy.models import GoInt64
from chaos.proxy.pipe import Signal
from chaos.proxy.toxics.base import Toxic, ms

if TYPE_CHECKING:
    from chaos.proxy.pipe import Stub


class ResetPeerToxic(Toxic):
    type_name = "reset_peer"
    resets_peer = True

    timeout: GoInt64 = 0

    async def pipe(self, stub: Stub) -> None:
        item = await stub.receive()
        if item is Signal.INTERRUPTED:
            return
        stub.commit_to_close()
        if self.timeout > 0:
            await stub.clock.sleep(ms(self.timeout))
        stub.close()

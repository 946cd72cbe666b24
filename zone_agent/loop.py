"""The event loop ``gtm zone`` runs on: uvloop when it is installed, else asyncio's.

uvloop (libuv under asyncio's API) cuts the event loop's share of each proxied request —
socket reads and writes, callbacks, timers — which is most of the agent's time per
request besides aiohttp itself (``bench/zone_proxy.py`` prints both loops' figures). It
is a dependency with wheels for Linux and macOS; where it is missing (another platform,
a stripped install) the agent runs on asyncio's own loop, with the same behaviour.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from enum import StrEnum
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopKind(StrEnum):
    AUTO = "auto"
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def loop_factory(kind: LoopKind = LoopKind.AUTO) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop function for ``kind`` (``auto``: uvloop if importable, else asyncio).

    Raises:
        ModuleNotFoundError: ``uvloop`` asked for and not installed.
    """
    if kind is not LoopKind.ASYNCIO:
        try:
            import uvloop
        except ModuleNotFoundError:
            if kind is LoopKind.UVLOOP:
                raise
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], kind: LoopKind = LoopKind.AUTO) -> T:
    """``asyncio.run(main)`` on the loop ``kind`` names."""
    factory = loop_factory(kind)
    with asyncio.Runner(loop_factory=factory) as runner:
        loop = runner.get_loop()
        log.debug("event loop: %s.%s", type(loop).__module__, type(loop).__name__)
        return runner.run(main)

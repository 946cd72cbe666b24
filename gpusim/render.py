"""gpu-sim's renderer: the process of a worker's own that tokenizes prompts for the
peers' ``POST /v1/completions/render`` (:mod:`gpusim.peer_api`), as vLLM's API-server
process renders beside (not in) its engine-core process.

vllm-router's prefix policies render every prompt on every worker before each
decision; done on the worker's event loop, that tokenizing held the loop that drives
the emulated GPU. This module is all the renderer process imports (``spawn``: the
standard library and :mod:`gtm.tokens`), so it starts fast.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from gtm.tokens import encode_text_ids


def token_ids_json(texts: Sequence[str]) -> list[str]:
    """Each text's token ids (:func:`gtm.tokens.encode_text_ids`, what the engine
    charges and hashes) as a JSON array: the renderer process's work."""
    return [json.dumps(encode_text_ids(text).tolist()) for text in texts]


#: How often the renderer process checks that its worker is still there (s): a worker
#: killed outright (SIGKILL) runs no cleanup, and its renderer then exits by itself.
ORPHAN_CHECK_S = 1.0


def _exit_with_parent(parent: int) -> None:
    """The renderer process's initializer: exit once ``parent`` (the worker) is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-worker", daemon=True).start()


class Renderer:
    """vLLM's frontend for ``/render``: one process of the worker's own that tokenizes
    prompts, started at the first render (a worker no peer renders on never has it),
    stopped with the server, and gone within :data:`ORPHAN_CHECK_S` of a worker killed
    outright. ``spawn``, not ``fork``: the worker runs threads (the KV-event
    publisher's) that a fork would copy mid-state."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def token_ids_json(self, texts: Sequence[str]) -> list[str]:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=context,
                initializer=_exit_with_parent,
                initargs=(os.getpid(),),
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, token_ids_json, list(texts))

    async def close(self) -> None:
        """Stop the renderer process and wait until it has ended (the executor's
        shutdown joins it, off the event loop): a stopped worker leaves no process
        behind, and nothing but the executor reaps it (a second ``waitpid`` on the same
        child races the executor's and can see it as still running)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)

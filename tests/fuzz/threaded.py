"""Run an asyncio server on its own loop in a thread, so that synchronous hypothesis
tests can drive it with blocking clients (real sockets) case after case."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` waits for a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10.0)
        self.loop.close()


class Client:
    """A keep-alive HTTP/1.1 client (reconnects when the server closes)."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self._host, self._port = host, port
        self._headers = headers or {}
        self._conn = http.client.HTTPConnection(host, port, timeout=30)

    def request(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json", **self._headers}
        for attempt in (1, 2):
            try:
                self._conn.request(method, path, body=body, headers=headers)
                response = self._conn.getresponse()
                data = response.read()
                if response.will_close:
                    self._conn.close()
                return response.status, dict(response.getheaders()), data
            except (ConnectionError, http.client.RemoteDisconnected, BrokenPipeError):
                self._conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        raw = None if body is None else json.dumps(body).encode()
        status, _, data = self.request(method, path, raw)
        return status, json.loads(data)

    def close(self) -> None:
        self._conn.close()

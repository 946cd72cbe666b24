"""One proxy: a TCP listener that dials its upstream for every client (``proxy.go``).

- Accept, then dial. If the dial fails the client socket is closed at once, so the client
  sees connect-then-EOF, not ECONNREFUSED. There is no dial timeout beyond the OS one.
- Each connection gets two links (:mod:`chaos.proxy.link`) built from the proxy's toxic
  chains as they are at that moment. If a ``reset_peer`` toxic is in a chain then, both
  sockets get SO_LINGER 0, so closing them sends RST.
- Disabling (stop) closes the listener — new clients get ECONNREFUSED — and drops every
  open connection. Enabling binds again; a bind error is reported as a 500.

A connection's tasks live in a :class:`asyncio.TaskGroup` scoped to that connection
(rather than the process-wide :class:`gtm.tasks.TaskSupervisor`, which keeps every task
it ever named): they are all cancelled and awaited when the connection ends.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
from dataclasses import dataclass

from chaos.proxy.addresses import (
    bind_listener,
    bound_address,
    resolved_string,
    upstream_target,
)
from chaos.proxy.collection import ToxicCollection
from chaos.proxy.errors import AddressError
from chaos.proxy.link import Link
from chaos.proxy.metrics import ConnectionMeter, ProxyMetrics
from chaos.proxy.models import Direction, ProxyPatch, ProxyView
from gtm.clock import Clock

log = logging.getLogger(__name__)

#: SO_LINGER on, timeout 0: close() discards unsent data and sends RST (reset_peer).
_LINGER_RESET = struct.pack("ii", 1, 0)


@dataclass(frozen=True, slots=True)
class ProxyRuntime:
    """What every proxy of a server shares: time, randomness, metrics."""

    clock: Clock
    rng: random.Random
    metrics: ProxyMetrics


class Proxy:
    """A named proxy ``listen`` → ``upstream`` with its toxics and open connections."""

    def __init__(self, name: str, listen: str, upstream: str, runtime: ProxyRuntime) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self._runtime = runtime
        self.toxics = ToxicCollection(on_change=self._toxics_changed)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        for direction in Direction:
            self._toxics_changed(direction, 0)

    def view(self) -> ProxyView:
        return ProxyView(
            name=self.name,
            listen=self.listen,
            upstream=self.upstream,
            enabled=self.enabled,
            toxics=self.toxics.views(),
        )

    @property
    def connection_count(self) -> int:
        return len(self._handlers)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind ``listen`` and accept; ``listen`` becomes the bound address."""
        if self.enabled:
            return
        sock = await bind_listener(self.listen)
        try:
            self._server = await asyncio.start_server(self._accept, sock=sock)
        except OSError as exc:
            sock.close()
            raise AddressError(f"listen tcp {self.listen}: {exc}") from None
        self.listen = bound_address(sock)
        self.enabled = True
        log.info("proxy started name=%s listen=%s upstream=%s", *self._ids())

    async def stop(self) -> None:
        """Close the listener and drop every connection (no-op when disabled)."""
        if not self.enabled:
            return
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()  # closes the listening socket now: new clients are refused
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.wait(handlers)
        log.info("proxy stopped name=%s listen=%s upstream=%s", *self._ids())

    async def differs(self, listen: str, upstream: str) -> bool:
        """``Proxy.Differs``: compares the *resolved* listen address and the upstream."""
        return await resolved_string(listen) != self.listen or upstream != self.upstream

    async def update(self, patch: ProxyPatch) -> None:
        """``Proxy.Update``: absent fields keep their value; a new address restarts."""
        listen = self.listen if patch.listen is None else patch.listen
        upstream = self.upstream if patch.upstream is None else patch.upstream
        enabled = self.enabled if patch.enabled is None else patch.enabled
        if await self.differs(listen, upstream):
            await self.stop()
            self.listen, self.upstream = listen, upstream
        if enabled != self.enabled:
            if enabled:
                await self.start()
            else:
                await self.stop()

    def _ids(self) -> tuple[str, str, str]:
        return self.name, self.listen, self.upstream

    def _toxics_changed(self, direction: Direction, count: int) -> None:
        self._runtime.metrics.active_toxics.labels(self.name, direction.value).set(count)

    # ------------------------------------------------------------------ connections
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            # stop() cancels handlers. Python 3.11's start_server callback calls
            # task.exception() on the finished handler, which raises for a cancelled
            # task, so the handler absorbs its own cancellation and ends normally.
            if task is not None:
                task.uncancel()
            writer.transport.abort()
        except Exception:  # a bug in a toxic or link: drop this connection, keep serving
            log.exception("connection failed name=%s", self.name)
            writer.transport.abort()
        finally:
            if task is not None:
                self._handlers.discard(task)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        metrics = self._runtime.metrics
        metrics.connections.labels(self.name).inc()
        try:
            host, port = upstream_target(self.upstream)
            upstream_r, upstream_w = await asyncio.open_connection(host, port)
        except (OSError, AddressError) as exc:
            log.info("upstream unreachable name=%s upstream=%s: %s", self.name, self.upstream, exc)
            metrics.upstream_failures.labels(self.name).inc()
            client_w.close()
            return
        if self.toxics.resets_peer():
            for side in (client_w, upstream_w):
                _linger_reset(side)
        metrics.active_connections.labels(self.name).inc()
        try:
            await self._pump(client_r, client_w, upstream_r, upstream_w)
        finally:
            metrics.active_connections.labels(self.name).dec()
            upstream_w.transport.abort()

    async def _pump(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        upstream_r: asyncio.StreamReader,
        upstream_w: asyncio.StreamWriter,
    ) -> None:
        runtime = self._runtime
        meter = ConnectionMeter(runtime.metrics, self.name, self.listen, self.upstream)
        async with asyncio.TaskGroup() as group:
            links = [
                Link(
                    direction,
                    source,
                    sink,
                    clock=runtime.clock,
                    rng=runtime.rng,
                    task_factory=group.create_task,
                    meter=meter,
                )
                for direction, source, sink in (
                    (Direction.UPSTREAM, client_r, upstream_w),
                    (Direction.DOWNSTREAM, upstream_r, client_w),
                )
            ]
            try:
                for link in links:
                    self.toxics.attach(link)
                for link in links:
                    await link.finished.wait()
            finally:
                for link in links:
                    self.toxics.detach(link)
                    link.abort()


def _linger_reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)

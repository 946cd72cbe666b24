"""Starting and stopping servers: one way for every HTTP listener, one shutdown grace.

Every HTTP server gtm runs (the three tiers, the GPU emulator, the local deployment's
front door and status page, the fault proxy's API) serves an aiohttp application the
same way:

* :class:`HttpServer` binds (``port`` 0: a free one), serves, and reports where it
  listens (:class:`Bound`: host, port, base URL with the scheme TLS implies);
  :meth:`HttpServer.stop` stops accepting, gives in-flight requests
  :data:`SHUTDOWN_GRACE_S` to finish and then cancels them;
* with a ``lean`` front (:class:`gtm.http1.LeanFront`: the hot endpoints and the rules
  they share with the application), the listener's connections are the lean server's
  first, and each becomes aiohttp's when it asks for anything else; which server a
  daemon runs is its choice (:class:`HttpServerKind`), the application is the same;
* on the data path, handlers are cancelled when their client goes away
  (``handler_cancellation``; aiohttp ≥ 3.9 leaves them running by default), so a
  proxied request releases its upstream, queue slot and quota at once; control APIs
  (``cancel_on_disconnect=False``) finish what they started;
* no aiohttp access log: the tiers write their own, with the decision's fields
  (:mod:`gtm.access`, ``--no-access-log`` turns it off);
* a request aiohttp cannot parse (an HTTP/2 preface such as sglang-router's probe, a
  malformed request line) is answered 400 and logged as one INFO line on
  ``aiohttp.server``, without a traceback (:class:`ServerLog`): a server must not log
  tracebacks on a client's bad input;
* :func:`settle_collector` is called once a server is up: what start-up allocated
  lives for the process, so full collections stop scanning it, and young collections
  run every 20,000 allocations, not 700;
* :func:`until_signalled` is the foreground process's wait: SIGINT or SIGTERM ends it,
  and its handlers are removed again; it tells a service manager the daemon is ready
  (:mod:`gtm.sdnotify`, only when one asked);
* :func:`add_service_routes` gives every service ``/healthz`` (the process answers),
  ``/readyz`` (the service's own answer) and ``/metrics`` (its injected registry, plus
  ``gtm_event_loop_tasks``, :mod:`gtm.loopstats`, and the process, Python and
  ``gtm_build_info`` collectors, :func:`gtm.metrics.register_runtime`).

The DNS listeners (``global_lb.dns.server``) bind UDP and TCP on one port themselves
(a UDP thread with batched system calls is not an aiohttp site); their answers are
synchronous, so nothing is in flight to wait for when they stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from gtm.errors import ConfigError
from gtm.loopstats import register_loop_tasks
from gtm.metrics import exposition, register_runtime
from gtm.sdnotify import notify
from gtm.tls import scheme as tls_scheme

if TYPE_CHECKING:
    from gtm.http1 import LeanFront

#: Seconds in-flight requests get to finish when a server stops; then they are
#: cancelled. Long enough for a non-streamed answer in its last tokens, short enough
#: that an orchestrator's stop (Kubernetes waits 30 s before SIGKILL) never kills us
#: mid-shutdown with leases and summaries still held.
SHUTDOWN_GRACE_S = 5.0
#: The routes :func:`add_service_routes` adds: probes and the scrape, many per minute and
#: never a user's request, so neither logged (gtm.access) nor traced (gtm.tracing).
SERVICE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Status of a request whose client went away before any response started (nginx's).
CLIENT_CLOSED = 499


class HttpServerKind(StrEnum):
    """Which server answers a daemon's hot endpoints (``--http-server``)."""

    #: The lean HTTP/1.1 server (:mod:`gtm.http1`) for them, aiohttp's for the rest.
    LEAN = "lean"
    #: aiohttp's for everything.
    AIOHTTP = "aiohttp"


@dataclass(frozen=True, slots=True)
class Bound:
    """Where a server listens once started."""

    host: str
    port: int
    #: ``http://host:port`` or ``https://…`` (IPv6 hosts in brackets).
    url: str


def base_url(host: str, port: int, server_ssl: ssl.SSLContext | None = None) -> str:
    """``scheme://host:port`` (``[host]`` for IPv6)."""
    shown = f"[{host}]" if ":" in host else host
    return f"{tls_scheme(server_ssl)}://{shown}:{port}"


class ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's request-handler log (``aiohttp.server``), with a client's malformed
    request as one line.

    aiohttp logs every request it cannot parse (:class:`HttpProcessingError`, already
    answered 400) at ERROR with the parser's traceback, except a bad method on a
    connection's first request (DEBUG, traceback still attached). Such a request is the
    client's error, not ours: one line at INFO (or aiohttp's level where lower) naming
    the peer and the parser's first line of complaint (nginx logs "client sent invalid
    request" at ``info`` too). Everything else, a handler's own
    exception in particular, passes through unchanged, traceback included.
    """

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            complaint = (str(exc.message).strip().splitlines() or [""])[0].rstrip(":")
            shown = f"{msg}: %s (%s)"
            self.logger.log(min(level, logging.INFO), shown, *args, complaint, type(exc).__name__)
            return
        super().log(level, msg, *args, **kwargs)


class HttpServer:
    """An aiohttp application on one address: ``await start()``, then ``await stop()``.

    ``sock`` serves an already bound socket instead of ``host:port`` (a port reserved
    before the server could start). ``cancel_on_disconnect=False`` lets a handler run
    to its end when its client goes away (control APIs: a drain half done is worse than
    one nobody hears about). ``lean``: a lean front for the hot endpoints on the same
    listener (:mod:`gtm.http1`). A failure to bind is a :class:`~gtm.errors.ConfigError`
    naming the address.
    """

    def __init__(
        self,
        app: web.Application,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        ssl_context: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        sock: socket.socket | None = None,
        what: str = "HTTP",
        cancel_on_disconnect: bool = True,
        lean: LeanFront | None = None,
    ) -> None:
        self._app = app
        self._lean = lean
        self._listener: asyncio.Server | None = None
        self._cancel_on_disconnect = cancel_on_disconnect
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._reuse_port = reuse_port
        self._sock = sock
        self._what = what
        self._runner: web.AppRunner | None = None
        self.bound: Bound | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> Bound:
        """Bind and serve; where it listens."""
        runner = web.AppRunner(
            self._app,
            handler_cancellation=self._cancel_on_disconnect,
            shutdown_timeout=SHUTDOWN_GRACE_S,
            access_log=None,
            logger=ServerLog(logging.getLogger("aiohttp.server")),
        )
        await runner.setup()
        if self._lean is not None:
            return await self._start_lean(runner, self._lean)
        site: web.BaseSite
        if self._sock is not None:
            site = web.SockSite(runner, self._sock, ssl_context=self._ssl)
        else:
            site = web.TCPSite(
                runner,
                self._host,
                self._port,
                ssl_context=self._ssl,
                reuse_port=self._reuse_port or None,
            )
        try:
            await site.start()
        except OSError as exc:
            raise await self._cannot_listen(runner, exc) from None
        self._runner = runner
        host, port = _first_address(runner.addresses, self._host)
        self.bound = Bound(host, port, base_url(host, port, self._ssl))
        return self.bound

    async def _cannot_listen(self, runner: web.AppRunner, exc: OSError) -> ConfigError:
        await runner.cleanup()
        return ConfigError(
            f"cannot listen for {self._what} on {self._host}:{self._port}: {exc.strerror or exc}"
        )

    async def _start_lean(self, runner: web.AppRunner, lean: LeanFront) -> Bound:
        """The listener with the lean front's protocol, aiohttp's behind it."""
        server = runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        factory = lean.protocol(server)
        try:
            if self._sock is not None:
                listener = await loop.create_server(
                    factory, sock=self._sock, ssl=self._ssl, backlog=128
                )
            else:
                listener = await loop.create_server(
                    factory,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    backlog=128,
                    reuse_port=self._reuse_port or None,
                )
        except OSError as exc:
            raise await self._cannot_listen(runner, exc) from None
        self._runner = runner
        self._listener = listener
        addresses = [sock.getsockname() for sock in listener.sockets]
        host, port = _first_address(addresses, self._host)
        self.bound = Bound(host, port, base_url(host, port, self._ssl))
        return self.bound

    async def stop(self) -> None:
        """Stop accepting; in-flight requests get :data:`SHUTDOWN_GRACE_S`. Idempotent."""
        runner, self._runner = self._runner, None
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if runner is not None:
            if self._lean is not None:
                await asyncio.gather(self._lean.shutdown(SHUTDOWN_GRACE_S), runner.cleanup())
            else:
                await runner.cleanup()


def _first_address(addresses: Iterable[object], default_host: str) -> tuple[str, int]:
    for address in addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return str(address[0]), int(address[1])
    raise ConfigError(f"the server on {default_host} reports no bound address")


@contextlib.asynccontextmanager
async def serving(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    what: str = "HTTP",
) -> AsyncIterator[Bound]:
    """``async with serving(app, host, port) as bound:`` — an :class:`HttpServer` for
    the block."""
    server = HttpServer(app, host, port, ssl_context=ssl_context, reuse_port=reuse_port, what=what)
    bound = await server.start()
    try:
        yield bound
    finally:
        await server.stop()


def add_service_routes(
    app: web.Application,
    *,
    registry: CollectorRegistry,
    readyz: Callable[[web.Request], Awaitable[web.Response]],
) -> None:
    """``GET /healthz`` (200 while the process answers), ``GET /readyz`` (``readyz``:
    200 when the service can take requests, else 503) and ``GET /metrics``
    (``registry`` in Prometheus' text format)."""

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=await exposition(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    register_loop_tasks(registry)
    register_runtime(registry)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


#: The cyclic garbage collector's generation-0 threshold in a serving process (CPython's
#: default is 700). Requests and cold decisions leave a few objects alive, so at 700
#: young collections ran every few requests, inside enough of them to set the
#: per-request p99, and each walked the requests in flight again; at 20,000 they run
#: far less often, each longer, and both p99 and p99.9 drop (bench/global_decision.py;
#: 5,000 and 100,000 were no better). The proxy's CPU per request: bench/zone_proxy.py.
COLLECTOR_GEN0_THRESHOLD = 20_000


def settle_collector() -> None:
    """What a serving process does once it is up. What start-up allocated (modules, the
    app, the first views) lives for the whole process, so it is collected once and
    moved out of the collector's reach (``gc.freeze``, Python docs): full collections
    then scan only per-request objects, keeping a gen-2 pass inside the event loop's
    lag budget. And the generation-0 threshold becomes :data:`COLLECTOR_GEN0_THRESHOLD`
    (never lowered: a host that chose a higher one keeps it)."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, COLLECTOR_GEN0_THRESHOLD), gen1, gen2)


async def until_signalled(
    signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> None:
    """Wait for one of ``signals`` (default SIGINT, SIGTERM); the handlers are removed
    when it returns or is cancelled. A service manager that asked for it
    (``NOTIFY_SOCKET``) hears ``READY=1`` when the wait starts — every daemon waits
    here once its listeners are bound — and ``STOPPING=1`` when a signal ends it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    chosen = tuple(signals)
    for signum in chosen:
        loop.add_signal_handler(signum, stop.set)
    notify("READY=1")  # a daemon waits here once it serves (gtm.sdnotify)
    try:
        await stop.wait()
        notify("STOPPING=1")
    finally:
        for signum in chosen:
            loop.remove_signal_handler(signum)


__all__ = [
    "CLIENT_CLOSED",
    "SERVICE_PATHS",
    "SHUTDOWN_GRACE_S",
    "Bound",
    "HttpServer",
    "HttpServerKind",
    "ServerLog",
    "add_service_routes",
    "base_url",
    "serving",
    "settle_collector",
    "until_signalled",
]

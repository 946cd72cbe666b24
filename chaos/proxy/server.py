"""The Toxiproxy 2.x HTTP API (``api.go``) on aiohttp.

Routing is done here rather than by aiohttp's router so that the edges match gorilla/mux
v1.8 as Toxiproxy uses it: an unknown path is 404 ``404 page not found``, a known path
with the wrong method is 405 with an empty body, there is no trailing-slash redirect,
and the middlewares run on matched routes only. Those middlewares add
``X-Toxiproxy-Request-Id``, refuse browsers (a ``User-Agent`` starting with ``Mozilla/``
gets 403 ``User agent not allowed``: the API has no authentication, so this blunts
cross-site requests from a browser) and bound every handler to 25 s (then 503 with an
empty body, like ``http.TimeoutHandler``).

Errors are ``{"error": msg, "status": code}`` plus a newline, sent as
``text/plain; charset=utf-8`` with ``X-Content-Type-Options: nosniff`` — Go's
``http.Error`` overrides the JSON content type the handler set. Nothing a client sends
can produce a traceback: unexpected failures are logged and answered with a 500 body.

Unlike Toxiproxy, ``/metrics`` is always served (gtm services always expose metrics).

Authentication is opt-in (``gtm chaos proxy --admin-token-file``), so that the API stays
interchangeable with Toxiproxy's for clients that cannot send headers: with a guard
(:mod:`gtm.admin_auth`), every route but ``/version`` and ``/metrics`` needs a bearer
token (``read-only`` for GET, ``operator`` otherwise) and every call is audited; refusals
keep this API's error shape and add ``WWW-Authenticate``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from chaos.proxy import gojson
from chaos.proxy.errors import ApiError
from chaos.proxy.service import TOXIPROXY_VERSION, FaultProxyService
from gtm.admin_auth import AdminGuard, admin_middleware
from gtm.errors import ConfigError
from gtm.openai_errors import ApiError as AdminRefusal
from gtm.serve import HttpServer

log = logging.getLogger(__name__)

#: ``http.TimeoutHandler(next, 25*time.Second, "")`` in api.go.
HANDLER_TIMEOUT_SECONDS = 25.0
#: Toxiproxy reads bodies without a limit; 8 MiB holds a /populate of ~50k proxies.
MAX_BODY_BYTES = 8 * 1024 * 1024
REQUEST_ID_HEADER = "X-Toxiproxy-Request-Id"
_TEXT_PLAIN = "text/plain; charset=utf-8"

Params = Mapping[str, str]
Handler = Callable[[FaultProxyService, web.Request, Params], Awaitable[web.Response]]


# ---------------------------------------------------------------------- responses
def json_response(value: object, status: int = 200) -> web.Response:
    return web.Response(
        body=gojson.dumps(value).encode(),
        status=status,
        headers={"Content-Type": "application/json"},
    )


def error_response(message: str, status: int) -> web.Response:
    body = gojson.dumps({"error": message, "status": status}) + "\n"
    return web.Response(
        body=body.encode(),
        status=status,
        headers={"Content-Type": _TEXT_PLAIN, "X-Content-Type-Options": "nosniff"},
    )


def no_content() -> web.Response:
    return web.Response(status=204)


# ---------------------------------------------------------------------- handlers
async def _read(request: web.Request) -> bytes:
    return await request.read()


async def proxy_index(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    return json_response({name: view.to_wire() for name, view in svc.proxy_views().items()})


async def proxy_create(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    view = await svc.create_proxy(await _read(request))
    return json_response(view.to_wire(), status=201)


async def populate(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    result = await svc.populate(await _read(request))
    proxies = None if result.proxies is None else [view.to_wire() for view in result.proxies]
    if result.error is None:
        return json_response({"proxies": proxies}, status=201)
    body = {"error": result.error.message, "status": result.error.status, "proxies": proxies}
    return json_response(body, status=result.error.status)


async def proxy_show(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    return json_response(svc.get_proxy(p["proxy"]).to_wire())


async def proxy_update(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    if request.method == "POST":
        log.warning("ProxyUpdate: HTTP method POST is deprecated. Use HTTP PATCH instead.")
    view = await svc.update_proxy(p["proxy"], await _read(request))
    return json_response(view.to_wire())


async def proxy_delete(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    await svc.delete_proxy(p["proxy"])
    return no_content()


async def toxic_index(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    return json_response([view.to_wire() for view in svc.toxics(p["proxy"])])


async def toxic_create(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    view = await svc.create_toxic(p["proxy"], await _read(request))
    return json_response(view.to_wire())  # 200, not 201, as in Toxiproxy


async def toxic_show(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    return json_response(svc.get_toxic(p["proxy"], p["toxic"]).to_wire())


async def toxic_update(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    if request.method == "POST":
        log.warning("ToxicUpdate: HTTP method POST is deprecated. Use HTTP PATCH instead.")
    view = await svc.update_toxic(p["proxy"], p["toxic"], await _read(request))
    return json_response(view.to_wire())


async def toxic_delete(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    await svc.delete_toxic(p["proxy"], p["toxic"])
    return no_content()


async def reset(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    await svc.reset()
    return no_content()


async def version(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
    body = f'{{"version": "{TOXIPROXY_VERSION}"}}\n'
    return web.Response(
        body=body.encode(), headers={"Content-Type": "application/json;charset=utf-8"}
    )


# ---------------------------------------------------------------------- routing
ANY_METHOD = "*"


@dataclass(frozen=True, slots=True)
class Route:
    pattern: tuple[str, ...]  # literal segments, or "{name}" for a non-empty variable
    methods: Mapping[str, Handler]

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.pattern):
            return None
        params: dict[str, str] = {}
        for part, segment in zip(self.pattern, segments, strict=True):
            if part.startswith("{"):
                if not segment:
                    return None
                params[part[1:-1]] = segment
            elif part != segment:
                return None
        return params

    def handler(self, method: str) -> Handler | None:
        return self.methods.get(method) or self.methods.get(ANY_METHOD)


def _methods(table: dict[str, Handler]) -> Mapping[str, Handler]:
    return MappingProxyType(table)


def routes(registry: CollectorRegistry) -> tuple[Route, ...]:
    """The route table of ``api.go`` ``Routes()``, in its order, plus ``/metrics``."""

    async def metrics(svc: FaultProxyService, request: web.Request, p: Params) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    update = proxy_update
    return (
        Route(("reset",), _methods({"POST": reset})),
        Route(("proxies",), _methods({"GET": proxy_index, "POST": proxy_create})),
        Route(("populate",), _methods({"POST": populate})),
        Route(
            ("proxies", "{proxy}"),
            _methods({"GET": proxy_show, "POST": update, "PATCH": update, "DELETE": proxy_delete}),
        ),
        Route(
            ("proxies", "{proxy}", "toxics"),
            _methods({"GET": toxic_index, "POST": toxic_create}),
        ),
        Route(
            ("proxies", "{proxy}", "toxics", "{toxic}"),
            _methods(
                {
                    "GET": toxic_show,
                    "POST": toxic_update,
                    "PATCH": toxic_update,
                    "DELETE": toxic_delete,
                }
            ),
        ),
        Route(("version",), _methods({"GET": version})),
        Route(("metrics",), _methods({ANY_METHOD: metrics})),
    )


class ApiDispatcher:
    """The single aiohttp handler: route, run the middlewares, never leak a traceback."""

    def __init__(self, service: FaultProxyService, registry: CollectorRegistry) -> None:
        self._service = service
        self._routes = routes(registry)

    async def handle(self, request: web.Request) -> web.Response:
        segments = request.path[1:].split("/")
        matched = [
            (route, params)
            for route in self._routes
            if (params := route.match(segments)) is not None
        ]
        if not matched:
            return web.Response(
                body=b"404 page not found\n",
                status=404,
                headers={"Content-Type": _TEXT_PLAIN, "X-Content-Type-Options": "nosniff"},
            )
        for route, params in matched:
            handler = route.handler(request.method)
            if handler is not None:
                response = await self._guarded(handler, request, params)
                break
        else:
            response = web.Response(status=405)
        response.headers[REQUEST_ID_HEADER] = secrets.token_hex(10)
        return response

    async def _guarded(
        self, handler: Handler, request: web.Request, params: Params
    ) -> web.Response:
        if request.headers.get("User-Agent", "").startswith("Mozilla/"):
            return web.Response(
                body=b"User agent not allowed\n",
                status=403,
                headers={"Content-Type": _TEXT_PLAIN, "X-Content-Type-Options": "nosniff"},
            )
        try:
            async with asyncio.timeout(HANDLER_TIMEOUT_SECONDS):
                return await handler(self._service, request, params)
        except ApiError as exc:
            return error_response(exc.message, exc.status)
        except web.HTTPRequestEntityTooLarge:
            return error_response(f"bad request body: larger than {MAX_BODY_BYTES} bytes", 413)
        except TimeoutError:
            log.warning("handler timed out method=%s path=%s", request.method, request.path)
            return web.Response(status=503)
        except Exception:
            log.exception("API handler failed method=%s path=%s", request.method, request.path)
            return error_response("internal error (see the server log)", 500)


#: Paths open without a token even when a guard is configured (no state, no faults).
OPEN_PATHS = frozenset({"/version", "/metrics"})


def _refusal(error: AdminRefusal) -> web.StreamResponse:
    response = error_response(error.message, error.status)
    response.headers.update(error.headers())
    return response


def build_app(
    service: FaultProxyService, registry: CollectorRegistry, guard: AdminGuard | None = None
) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    if guard is not None:
        app.middlewares.append(
            admin_middleware(guard, lambda r: r.path not in OPEN_PATHS, render=_refusal)
        )
    app.router.add_route("*", "/{tail:.*}", ApiDispatcher(service, registry).handle)
    return app


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening socket for the API, or a :class:`ConfigError` saying why not."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _type, _proto, _name, address = infos[0]
        return socket.create_server(address[:2], family=family)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class FaultProxyServer:
    """The API server plus the proxies it manages; ``start`` → ``close``."""

    def __init__(
        self,
        service: FaultProxyService,
        registry: CollectorRegistry,
        guard: AdminGuard | None = None,
    ) -> None:
        self.service = service
        self._app = build_app(service, registry, guard)
        self._server: HttpServer | None = None
        self.address: tuple[str, int] | None = None

    @property
    def url(self) -> str:
        if self.address is None:
            raise RuntimeError("server not started")
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    async def start(self, host: str = "127.0.0.1", port: int = 8474) -> tuple[str, int]:
        sock = listen_socket(host, port)
        self._server = HttpServer(
            self._app, host, port, sock=sock, what="the fault proxy API", cancel_on_disconnect=False
        )
        bound = await self._server.start()
        self.address = (bound.host, bound.port)
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self.service.close()

"""A typed adapter around toxiproxy-python 0.1.1 that fixes its pitfalls.

toxiproxy-python (the client the design names; import name ``toxiproxy``) works against
Toxiproxy 2.12 and against our server, but (read against its 0.1.1 source):

1. only 400/404/409 raise; a 500 bind error surfaces as ``KeyError: 'name'``, a failed
   re-enable goes unnoticed, a 503 raises JSONDecodeError;
2. ``version()`` returns raw bytes, after an AF_INET-only TCP probe;
3. host and port are *class attributes*: one server per process;
4. no HTTP timeouts: a hung server hangs the caller;
5. ``populate()`` is emulated client-side (N+1 GETs, not atomic, compares raw listen
   strings so ``localhost:…`` proxies are recreated on every call);
6. no toxic update; 7. ``add_toxic`` returns None and ``create`` does a racy pre-GET;
8. ``Proxy.down()`` re-enables on exit even if the proxy was disabled before;
9. updates use the deprecated POST (our server accepts it, as 2.12 does);
and names are pasted into URLs unescaped.

:class:`ToxiproxyClient` routes every request through the library's ``APIConsumer``, but
with this client's host and port, a ``requests`` session with timeouts, and a status
check on every response that raises a typed :class:`~chaos.proxy.errors.ToxiproxyError`
(fixes 1, 3, 4). Its own methods return typed views and use the real endpoints
(``/populate``, ``GET /proxies/{p}``, toxic update; fixes 2, 5–8). ``library()`` hands
out the library's own ``Toxiproxy`` object bound the same way, for code that wants the
library API itself — its objects are usable only inside that ``with`` block.

The library keeps its address in class attributes and calls ``requests`` through a
module global, so binding swaps both for the duration of a call under a process-wide
lock (calls from several threads are serialised; nested bindings restore in order).
It speaks plain HTTP only, like the library.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import requests
import toxiproxy  # type: ignore[import-untyped]
import toxiproxy.api  # type: ignore[import-untyped]

from chaos.proxy import errors
from chaos.proxy.errors import ToxiproxyError
from chaos.proxy.models import ProxyView, ToxicView
from gtm._version import __version__
from gtm.errors import ConfigError

#: Guards the library's class-level address and module-level ``requests`` while bound.
_LIBRARY_LOCK = threading.RLock()

DEFAULT_URL = "http://127.0.0.1:8474"
#: Seconds to connect and to wait for each response. Toxiproxy's own handler timeout is
#: 25 s; a healthy server answers in milliseconds, so 5 s flags a stuck one quickly.
DEFAULT_TIMEOUT = 5.0

_STATUS_ERRORS: Mapping[int, type[ToxiproxyError]] = {
    400: errors.ToxiproxyBadRequest,
    404: errors.ToxiproxyNotFound,
    409: errors.ToxiproxyConflict,
    503: errors.ToxiproxyUnavailable,
}


def raise_for_status(operation: str, status: int, body: bytes) -> None:
    """Raise the typed error for a non-2xx answer (Toxiproxy's ``{"error": …}`` body)."""
    if 200 <= status < 300:
        return
    message = body.decode("utf-8", errors="replace").strip() or "(empty body)"
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        message = str(json.loads(message)["error"])
    raise _STATUS_ERRORS.get(status, errors.ToxiproxyServerError)(operation, message, status)


class _CheckedRequests:
    """Stands in for the ``requests`` module inside ``toxiproxy.api`` while bound."""

    def __init__(self, session: requests.Session, timeout: float) -> None:
        self._session = session
        self._timeout = timeout

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return self._request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        return self._request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> requests.Response:
        return self._request("DELETE", url, **kwargs)

    def _request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        operation = f"{method} {urllib.parse.urlsplit(url).path}"
        kwargs.setdefault("timeout", self._timeout)
        try:
            response = self._session.request(method, url, **kwargs)
        except requests.exceptions.RequestException as exc:
            raise errors.ToxiproxyUnavailable(operation, str(exc)) from None
        raise_for_status(operation, response.status_code, response.content)
        return response


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class ToxiproxyClient:
    """A Toxiproxy API client bound to one server, with timeouts and status checks."""

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ConfigError(f"Toxiproxy URL must look like http://HOST:PORT, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 8474
        self.timeout = timeout
        self._session = requests.Session()
        self._session.headers["User-Agent"] = f"gtm-chaos/{__version__} toxiproxy-python"

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> ToxiproxyClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ binding
    @contextlib.contextmanager
    def library(self) -> Iterator[Any]:
        """The library's ``toxiproxy.Toxiproxy``, talking to this server, checked."""
        consumer = toxiproxy.api.APIConsumer
        with _LIBRARY_LOCK:
            saved = consumer.host, consumer.port, toxiproxy.api.requests
            consumer.host, consumer.port = self.host, self.port
            toxiproxy.api.requests = _CheckedRequests(self._session, self.timeout)
            try:
                yield toxiproxy.Toxiproxy()
            finally:
                consumer.host, consumer.port, toxiproxy.api.requests = saved

    def _call(self, method: str, path: str, payload: object = None) -> Any:
        with self.library():
            consumer = toxiproxy.api.APIConsumer
            if method == "GET":
                response = consumer.get(path)
            elif method == "DELETE":
                response = consumer.delete(path)
            else:
                response = consumer.post(path, json=payload)
        return response.json() if response.content else None

    # ------------------------------------------------------------------ server
    def version(self) -> str:
        """The server's version string (the library returns raw bytes)."""
        return str(self._call("GET", "/version")["version"])

    def is_running(self) -> bool:
        """Does the API answer? (The library only probes the TCP port, IPv4 only.)"""
        try:
            self.version()
        except ToxiproxyError:
            return False
        return True

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")

    # ------------------------------------------------------------------ proxies
    def proxies(self) -> dict[str, ProxyView]:
        data = self._call("GET", "/proxies")
        return {name: ProxyView.model_validate(value) for name, value in data.items()}

    def get_proxy(self, name: str) -> ProxyView:
        return ProxyView.model_validate(self._call("GET", f"/proxies/{_quote(name)}"))

    def create_proxy(
        self, name: str, upstream: str, *, listen: str = "127.0.0.1:0", enabled: bool = True
    ) -> ProxyView:
        """Create a proxy; its ``listen`` in the result is the bound address."""
        body = {"name": name, "upstream": upstream, "listen": listen, "enabled": enabled}
        return ProxyView.model_validate(self._call("POST", "/proxies", body))

    def update_proxy(
        self,
        name: str,
        *,
        listen: str | None = None,
        upstream: str | None = None,
        enabled: bool | None = None,
    ) -> ProxyView:
        """Change a proxy; fields left None keep their value."""
        body = {
            key: value
            for key, value in (("listen", listen), ("upstream", upstream), ("enabled", enabled))
            if value is not None
        }
        return ProxyView.model_validate(self._call("POST", f"/proxies/{_quote(name)}", body))

    def enable(self, name: str) -> ProxyView:
        return self.update_proxy(name, enabled=True)

    def disable(self, name: str) -> ProxyView:
        return self.update_proxy(name, enabled=False)

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{_quote(name)}")

    def populate(self, proxies: Sequence[Mapping[str, object]]) -> list[ProxyView]:
        """Server-side ``/populate``: validated as a whole, proxies with unchanged
        addresses kept with their toxics. Returns every proxy handled."""
        data = self._call("POST", "/populate", list(proxies))
        return [ProxyView.model_validate(value) for value in data.get("proxies") or []]

    @contextlib.contextmanager
    def down(self, name: str) -> Iterator[ProxyView]:
        """Disable ``name`` for the block, then restore its *previous* state."""
        was_enabled = self.get_proxy(name).enabled
        view = self.disable(name)
        try:
            yield view
        finally:
            if was_enabled:
                self.enable(name)

    # ------------------------------------------------------------------ toxics
    def toxics(self, proxy: str) -> list[ToxicView]:
        data = self._call("GET", f"/proxies/{_quote(proxy)}/toxics")
        return [ToxicView.model_validate(value) for value in data]

    def get_toxic(self, proxy: str, name: str) -> ToxicView:
        path = f"/proxies/{_quote(proxy)}/toxics/{_quote(name)}"
        return ToxicView.model_validate(self._call("GET", path))

    def add_toxic(
        self,
        proxy: str,
        type: str,
        *,
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
        attributes: Mapping[str, object] | None = None,
    ) -> ToxicView:
        """Add a toxic; returns it as the server stored it (name defaults to type_stream)."""
        body = {
            "name": name or f"{type}_{stream}",
            "type": type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": dict(attributes or {}),
        }
        data = self._call("POST", f"/proxies/{_quote(proxy)}/toxics", body)
        return ToxicView.model_validate(data)

    def update_toxic(
        self,
        proxy: str,
        name: str,
        *,
        toxicity: float | None = None,
        attributes: Mapping[str, object] | None = None,
    ) -> ToxicView:
        """Merge ``attributes`` into the toxic and/or set its toxicity, in place."""
        body: dict[str, object] = {"attributes": dict(attributes or {})}
        if toxicity is not None:
            body["toxicity"] = toxicity
        path = f"/proxies/{_quote(proxy)}/toxics/{_quote(name)}"
        return ToxicView.model_validate(self._call("POST", path, body))

    def delete_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{_quote(proxy)}/toxics/{_quote(name)}")

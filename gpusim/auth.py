"""vLLM's ``--api-key`` and an access log, for the emulated worker.

**API key** (:func:`key_middleware`), as vLLM's ``AuthenticationMiddleware``
(``vllm/entrypoints/serve/utils/server_utils.py``; ``--api-key`` wins over the
``VLLM_API_KEY`` environment variable, several keys may be given): a request whose path
starts with one of :data:`GUARDED_PREFIXES` needs ``Authorization: Bearer <key>`` (the
scheme in any case, the key compared by SHA-256 digest in constant time) or it is
answered ``401 {"error": "Unauthorized"}`` — vLLM's body, not OpenAI's error shape.
``OPTIONS`` requests and every other path (``/health``, ``/metrics``, ``/admin/*``) pass
without a key, so a zone agent scrapes and checks a keyed worker as any other.

**Access log** (:class:`AccessLog`, opt-in: ``--access-log-file PATH``, ``-`` for
stderr): one line per request when its handler ends, in uvicorn's access-log format,
which is what a vLLM writes — client, method, path, status; no header, as uvicorn logs
none. With ``--access-log-headers`` (a debugging aid, never for production) the line
also carries every request header with its value, so a credential that reaches the
worker shows in the log: that is how the tests prove a tenant's key never does. Even
then the worker's own accepted key is written as ``Bearer <worker key #N>``.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import TextIO

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import SecretStr

from gtm.credentials import VLLM_API_KEY_ENV
from gtm.errors import ConfigError
from gtm.models import Frozen

#: Path prefixes vLLM's ``--api-key`` guards (``GUARDED_PREFIX``); the emulator serves
#: only ``/v1`` of them. Older vLLM releases guarded ``/v1`` alone.
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
#: The environment variable vLLM reads its key from when ``--api-key`` is not given.
API_KEY_ENV = VLLM_API_KEY_ENV
#: ``--access-log-file`` value meaning standard error.
STDERR = "-"


def api_keys(flags: Sequence[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The keys a worker accepts: its ``--api-key`` flags (or ``GTM_API_KEY``, gtm's
    rule for every flag), else vLLM's ``VLLM_API_KEY``, else none (as vLLM: the flag
    wins over the variable)."""
    if flags:
        return tuple(flags)
    key = environ.get(API_KEY_ENV, "")
    return (key,) if key else ()


class WorkerAuthConfig(Frozen):
    """``gtm gpu-sim --api-key`` / ``--access-log-file`` / ``--access-log-headers``."""

    api_keys: tuple[SecretStr, ...] = ()
    access_log: str | None = None
    access_log_headers: bool = False


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyCheck:
    """The keys a worker accepts, kept as digests (as vLLM keeps them)."""

    def __init__(self, keys: Sequence[SecretStr]) -> None:
        self._digests = tuple(_digest(k.get_secret_value()) for k in keys if k.get_secret_value())

    def __repr__(self) -> str:
        return f"KeyCheck(<{len(self._digests)} keys hidden>)"

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def which(self, authorization: str) -> int | None:
        """The 1-based number of the key ``authorization`` (a header value) carries,
        or ``None``. Every key is compared, so the time does not tell which matched."""
        scheme, _, param = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        digest = _digest(param)
        found = None
        for number, known in enumerate(self._digests, start=1):
            if secrets.compare_digest(digest, known):
                found = number
        return found

    def guards(self, request: web.Request) -> bool:
        """Whether ``request`` must carry a key (vLLM: not OPTIONS, a guarded prefix)."""
        return (
            self.enabled
            and request.method != "OPTIONS"
            and request.path.startswith(GUARDED_PREFIXES)
        )


def key_middleware(check: KeyCheck) -> Middleware:
    """vLLM's ``AuthenticationMiddleware``: 401 ``{"error": "Unauthorized"}``."""

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if check.guards(request) and check.which(request.headers.get("Authorization", "")) is None:
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return require_key


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class AccessLog:
    """uvicorn's access-log lines, to a file (appended) or stderr; see the module doc."""

    def __init__(self, target: str, *, headers: bool, check: KeyCheck) -> None:
        self._headers = headers
        self._check = check
        self._own = target != STDERR
        try:
            self._out: TextIO = (
                open(Path(target), "a", encoding="utf-8", buffering=1)  # noqa: SIM115
                if self._own
                else sys.stderr
            )
        except OSError as exc:
            raise ConfigError(f"--access-log-file {target}: {exc.strerror}") from None

    def middleware(self) -> Middleware:
        @web.middleware
        async def access(request: web.Request, handler: Handler) -> web.StreamResponse:
            status: int | None = None
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                self.write(request, status)

        return access

    def write(self, request: web.Request, status: int | None) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "-"
        version = f"{request.version.major}.{request.version.minor}"
        shown = "-" if status is None else f"{status} {_phrase(status)}".rstrip()
        line = f'INFO:     {client} - "{request.method} {request.path_qs} HTTP/{version}" {shown}'
        if self._headers:
            line += " headers: " + "; ".join(
                f"{name}: {self._shown(name, value)}" for name, value in request.headers.items()
            )
        self._out.write(line + "\n")

    def _shown(self, name: str, value: str) -> str:
        if name.lower() == "authorization":
            number = self._check.which(value)
            if number is not None:
                return f"Bearer <worker key #{number}>"
        return value

    def close(self) -> None:
        if self._own:
            self._out.close()


class WorkerAuth:
    """What ``--api-key`` and the access log add to the emulator's app."""

    def __init__(self, config: WorkerAuthConfig | None = None) -> None:
        config = config or WorkerAuthConfig()
        self.check = KeyCheck(config.api_keys)
        self.log = (
            AccessLog(config.access_log, headers=config.access_log_headers, check=self.check)
            if config.access_log is not None
            else None
        )

    def outer(self) -> list[Middleware]:
        """Before the error middleware: the access log sees every final status."""
        return [] if self.log is None else [self.log.middleware()]

    def inner(self) -> list[Middleware]:
        """After it: the key check, before any handler (and before routing's 404)."""
        return [key_middleware(self.check)] if self.check.enabled else []

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


__all__ = [
    "API_KEY_ENV",
    "GUARDED_PREFIXES",
    "AccessLog",
    "KeyCheck",
    "WorkerAuth",
    "WorkerAuthConfig",
    "key_middleware",
]

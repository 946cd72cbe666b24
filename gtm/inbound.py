"""What every tier's handlers read from a client's request the same way.

* :func:`read_body` — the body, bounded by the application's ``client_max_size``; a
  larger one is a 413 in OpenAI's shape (aiohttp's own would be plain text).
* :func:`bearer_key` and :func:`tenant_of` — the API key of ``Authorization: Bearer …``
  and its tenant. The first use of a key costs one scrypt (policies' tenant directory
  caches it afterwards), so the lookup runs off the event loop. Each tier answers a
  missing or unknown key in its own words (a 401 either way).
* :func:`request_id` — the client's ``x-request-id`` when it is a sane one (printable,
  at most :data:`MAX_REQUEST_ID` characters), else a fresh id.
* :class:`Scope` — a request as the handlers and the per-request rules (access line,
  span, relay) read it, whichever server parsed it: aiohttp's ``web.Request`` or the
  lean server's (:mod:`gtm.http1`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from gtm import headers as gtm_headers
from gtm.openai_errors import ApiError
from policies import TenantDirectory
from policies.documents import Tenant

HEADER_REQUEST_ID = gtm_headers.REQUEST_ID


class Scope(Protocol):
    """One client request, read-only, with its per-request state.

    ``get`` looks up what a rule stored for this request under its key (aiohttp's
    ``web.RequestKey``: the access note, the span), ``None`` when nothing was.
    """

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def remote(self) -> str | None: ...

    def get(self, key: Any, /) -> Any: ...


#: Longest client request id kept (a longer one is replaced, not truncated).
MAX_REQUEST_ID = 128


async def read_body(request: web.Request) -> bytes:
    """The whole body; :class:`~gtm.openai_errors.ApiError` 413 when it is too large."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(
            413, f"the request body is too large: {exc.text}", code="body_too_large"
        ) from None


def bearer_key(headers: Mapping[str, str]) -> str | None:
    """The key of ``Authorization: Bearer <key>``, or ``None`` (absent or another scheme)."""
    scheme, _, key = headers.get("Authorization", "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


async def tenant_of(directory: TenantDirectory, key: str) -> Tenant:
    """The tenant of ``key``; raises :class:`policies.ApiKeyError` for an unknown one."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, directory.authenticate, key)


def new_request_id() -> str:
    """A fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


_new_id = new_request_id


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's ``x-request-id`` when sane, else ``None``."""
    rid = headers.get(HEADER_REQUEST_ID, "")
    if rid and len(rid) <= MAX_REQUEST_ID and rid.isprintable():
        return rid
    return None


def request_id(headers: Mapping[str, str], new: Callable[[], str] = new_request_id) -> str:
    """The client's ``x-request-id`` when sane, else ``new()``."""
    rid = client_request_id(headers)
    return new() if rid is None else rid


__all__ = [
    "Scope",
    "bearer_key",
    "client_request_id",
    "new_request_id",
    "read_body",
    "request_id",
    "tenant_of",
]

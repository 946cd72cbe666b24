"""Errors in the OpenAI API's JSON shape, answered by every tier and the emulator.

OpenAI's SDKs read ``{"error": {"message", "type", "param", "code"}}`` and pick their
exception class from the HTTP status (401 → AuthenticationError, 404 → NotFoundError,
429 → RateLimitError, …), so one shape serves every OpenAI client. ``Retry-After`` is
given in whole seconds (RFC 9110 §10.2.3) and never as 0, which clients read as "now".
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from enum import StrEnum

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gtm.errors import GtmError

log = logging.getLogger(__name__)


class ErrorType(StrEnum):
    """The ``error.type`` values gtm answers with (OpenAI's own where one exists)."""

    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    PERMISSION = "permission_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_exceeded"
    #: Quota kinds, as OpenAI's rate-limit errors name the exhausted limit.
    REQUESTS = "requests"
    TOKENS = "tokens"
    SERVER = "server_error"
    UNAVAILABLE = "service_unavailable"


class ApiError(GtmError):
    """An error answered to the client in OpenAI's JSON shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: ErrorType = ErrorType.INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type.value,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}

    def encode(self) -> bytes:
        """The JSON body, as :meth:`response` sends it."""
        return json.dumps(self.body()).encode()

    def response(self, **extra_headers: str) -> web.Response:
        """The aiohttp response carrying this error."""
        return web.json_response(
            self.body(), status=self.status, headers={**self.headers(), **extra_headers}
        )


class BadRequest(ApiError):
    """400: the request is malformed; the message names the field and what was expected."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(400, message, param=param, code=code or "invalid_value")


def _no_count(route: str, status: int) -> None:
    return None


def routing_error(request: web.Request, exc: web.HTTPException) -> ApiError:
    """aiohttp's own 4xx/5xx in OpenAI's shape: an unknown path is 404 ``unknown_url``
    (OpenAI answers ``Invalid URL (METHOD /path)``), a known path with another method
    405 ``method_not_allowed`` naming the allowed ones; others keep their status."""
    where = f"{request.method} {request.path}"
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return ApiError(
            405,
            f"Method not allowed ({where}); this path allows {allowed}",
            code="method_not_allowed",
        )
    if isinstance(exc, web.HTTPNotFound):
        return ApiError(404, f"Invalid URL ({where})", type=ErrorType.NOT_FOUND, code="unknown_url")
    kind = ErrorType.SERVER if exc.status >= 500 else ErrorType.INVALID_REQUEST
    return ApiError(exc.status, exc.reason, type=kind, code=str(exc.status))


def answer(exc: Exception, service: str, method: str, path: str) -> ApiError:
    """What a handler's exception is answered with, on either server: an
    :class:`ApiError` as it says; anything else is logged once (with its traceback) and
    answered 500 naming ``service``."""
    if isinstance(exc, ApiError):
        return exc
    log.error("unexpected error handling %s %s", method, path, exc_info=exc)
    return ApiError(
        500, f"internal error in the {service}", type=ErrorType.SERVER, code="internal_error"
    )


def error_middleware(service: str, count: Callable[[str, int], None] = _no_count) -> Middleware:
    """An aiohttp middleware that answers every failure in OpenAI's shape and counts every
    response as ``count(route, status)``; every tier's HTTP server (front door, regional
    LB, zone agent) installs it.

    :class:`ApiError` is answered as it says; aiohttp's own 4xx/5xx get the same shape
    (:func:`routing_error`; a 405 keeps its ``Allow`` header, RFC 9110 §15.5.6); anything
    else is logged once and answered 500 naming ``service`` — the server never drops a
    connection on a bug.
    """

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
            response = routing_error(request, exc).response(**allow)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            response = answer(exc, service, request.method, request.path).response()
        count(route, response.status)
        return response

    return errors


def openai_error(
    status: int, message: str, type: str, code: str | None = None, **headers: str
) -> web.Response:
    """An error response in OpenAI's shape, for call sites with no exception at hand."""
    body = {"error": {"message": message, "type": type, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)

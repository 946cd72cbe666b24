"""Errors of the fault proxy, server side and client side.

Server side, every refusal is an :class:`ApiError` carrying the HTTP status and the exact
message Toxiproxy 2.12 sends (``api.go``: ``ErrBadRequestBody``, ``ErrMissingField``,
``ErrProxyNotFound`` …), so that clients written against the real server parse ours the
same way. Client side (:mod:`chaos.proxy.client`), every failed call raises a
:class:`ToxiproxyError`; the tree::

    GtmError
    └── FaultProxyError
        ├── ApiError                   server: a request refused with a status and message
        │   └── AddressError           a listen/upstream address that cannot be used (500)
        └── ToxiproxyError             client: a call failed (status is None if no answer)
            ├── ToxiproxyUnavailable   no answer: refused, timed out, or 503
            ├── ToxiproxyBadRequest    400
            ├── ToxiproxyNotFound      404
            ├── ToxiproxyConflict      409
            └── ToxiproxyServerError   any other non-2xx (403, 405, 500 …)
"""

from __future__ import annotations

from gtm.errors import GtmError

HTTP_BAD_REQUEST = 400
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_INTERNAL = 500


class FaultProxyError(GtmError):
    """Root of the fault proxy's errors."""


class ApiError(FaultProxyError):
    """A request the API refuses: rendered as ``{"error": message, "status": status}``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class AddressError(ApiError):
    """A listen or upstream address that cannot be resolved, parsed or bound.

    Toxiproxy passes these up raw from Go's ``net`` package, so they are 500s with
    messages like ``listen tcp 127.0.0.1:3310: bind: address already in use``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, HTTP_INTERNAL)


def bad_request_body(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", HTTP_BAD_REQUEST)


def missing_field(field: str) -> ApiError:
    return ApiError(f"missing required field: {field}", HTTP_BAD_REQUEST)


def proxy_not_found() -> ApiError:
    return ApiError("proxy not found", HTTP_NOT_FOUND)


def proxy_already_exists() -> ApiError:
    return ApiError("proxy already exists", HTTP_CONFLICT)


def invalid_stream() -> ApiError:
    return ApiError("stream was invalid, can be either upstream or downstream", HTTP_BAD_REQUEST)


def invalid_toxic_type() -> ApiError:
    return ApiError("invalid toxic type", HTTP_BAD_REQUEST)


def toxic_already_exists() -> ApiError:
    return ApiError("toxic already exists", HTTP_CONFLICT)


def toxic_not_found() -> ApiError:
    return ApiError("toxic not found", HTTP_NOT_FOUND)


class ToxiproxyError(FaultProxyError):
    """A Toxiproxy API call failed. ``status`` is None when the server never answered."""

    def __init__(self, operation: str, message: str, status: int | None = None) -> None:
        prefix = f"HTTP {status}: " if status is not None else ""
        super().__init__(f"{operation}: {prefix}{message}")
        self.operation = operation
        self.message = message
        self.status = status


class ToxiproxyUnavailable(ToxiproxyError):
    """No usable answer: connection refused, timed out, or 503 (handler timeout)."""


class ToxiproxyBadRequest(ToxiproxyError):
    """400: malformed body, missing field, invalid stream or toxic type."""


class ToxiproxyNotFound(ToxiproxyError):
    """404: no such proxy or toxic."""


class ToxiproxyConflict(ToxiproxyError):
    """409: a proxy or toxic with that name already exists."""


class ToxiproxyServerError(ToxiproxyError):
    """Any other failure status (403 browser block, 405, 500 bind error …)."""

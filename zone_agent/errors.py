"""Errors of the zone agent, and how each one is answered in OpenAI's error shape.

Every error a client can cause or meet is an :class:`ApiError` carrying the HTTP status
and OpenAI's body ``{"error": {"message", "type", "param", "code"}}`` (the shape the
OpenAI SDKs parse into ``openai.APIStatusError``)::

    GtmError
    └── ZoneError
        ├── ScrapeError               a worker's /metrics could not be read or parsed
        ├── ModelNotServed            no GPU of the zone serves the model (also a
        │                             gtm.errors.RoutingError; answered as ModelNotFound)
        ├── UpstreamError             a worker's connection or response failed (also a
        │   │                         gtm.errors.UpstreamError, which the relay catches)
        │   ├── UpstreamConnectError  no connection (refused, unreachable, TLS handshake)
        │   ├── UpstreamRefused       TLS is configured: a plaintext worker is refused
        │   ├── UpstreamClosed        the worker closed the connection mid-response
        │   └── UpstreamProtocolError the worker's bytes are not HTTP/1.1
        └── ApiError                  answered to the client as JSON
            ├── BadRequest            400: malformed JSON, invalid field, prompt too long
            ├── ModelNotFound         404: no GPU of the zone serves the model
            └── NoCapacity            503 + Retry-After: no healthy GPU can take it
"""

from __future__ import annotations

from gtm import errors, openai_errors
from gtm.errors import GtmError
from gtm.openai_errors import BadRequest as BadRequest  # shared; re-exported
from gtm.openai_errors import ErrorType as ErrorType


class ZoneError(GtmError):
    """Root of the zone agent's errors."""


class ScrapeError(ZoneError):
    """A worker's /metrics could not be read or parsed."""


class ModelNotServed(errors.RoutingError, ZoneError):
    """No GPU of the zone serves the requested model (a decision's refusal; the proxy
    answers it as :class:`ModelNotFound`)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"no GPU in this zone serves model {model!r}")
        self.model = model


class UpstreamError(errors.UpstreamError, ZoneError):
    """A worker's connection or response failed."""


class UpstreamConnectError(UpstreamError):
    """No connection to the worker (refused, unreachable, TLS handshake failed)."""

    def __init__(self, target: str, os_error: OSError) -> None:
        super().__init__(f"cannot connect to {target}: {os_error}")
        self.os_error = os_error


class UpstreamRefused(UpstreamError):
    """TLS is configured, so a plaintext worker is not spoken to."""


class UpstreamClosed(UpstreamError):
    """The worker closed or reset the connection before its response ended."""


class UpstreamProtocolError(UpstreamError):
    """The worker's bytes are not an HTTP/1.1 response."""


class ApiError(openai_errors.ApiError, ZoneError):
    """An error answered to the client in OpenAI's JSON shape (:mod:`gtm.openai_errors`)."""


class ModelNotFound(ApiError):
    def __init__(self, model: str) -> None:
        super().__init__(
            404,
            f"The model `{model}` does not exist or is not served in this zone.",
            type=ErrorType.NOT_FOUND,
            param="model",
            code="model_not_found",
        )


class NoCapacity(ApiError):
    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(
            503,
            message,
            type=ErrorType.UNAVAILABLE,
            code="no_healthy_gpu",
            retry_after_s=retry_after_s,
        )

"""Errors of the regional LB, and how each one is answered in OpenAI's error shape.

Every error a client can cause or meet is an :class:`ApiError` carrying the HTTP status
and OpenAI's body ``{"error": {"message", "type", "param", "code"}}`` (the shape the
OpenAI SDKs parse into ``openai.APIStatusError``)::

    GtmError
    └── RegionalError
        ├── LeaseProtocolError        a quota lease record in the store is unusable
        └── ApiError                  answered to the client as JSON
            ├── BadRequest            400: malformed JSON, invalid field or header
            ├── Unauthorized          401: missing or unknown API key
            ├── ModelNotAllowed       403: the tenant may not use the model
            ├── ModelNotFound         404: no zone and no allowed peer serves the model
            ├── ResidencyRefused      451: residency allows no region (or not this one)
            ├── QuotaExceeded         429 + Retry-After: a tenant quota is used up
            ├── Overloaded            503 + Retry-After: queue full or queue TTL passed
            ├── LoopDetected          508: the request already took too many hops
            └── UpstreamFailed        502: every attempt failed before the first byte
"""

from __future__ import annotations

from gtm import openai_errors
from gtm.errors import GtmError
from gtm.openai_errors import BadRequest as BadRequest  # shared; re-exported
from gtm.openai_errors import ErrorType as ErrorType


class RegionalError(GtmError):
    """Root of the regional LB's errors."""


class LeaseProtocolError(RegionalError):
    """A quota lease record cannot be used (the message names the key)."""


class ApiError(openai_errors.ApiError, RegionalError):
    """An error answered to the client in OpenAI's JSON shape (:mod:`gtm.openai_errors`)."""


class Unauthorized(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(401, message, type=ErrorType.AUTHENTICATION, code="invalid_api_key")


class ModelNotAllowed(ApiError):
    def __init__(self, model: str) -> None:
        super().__init__(
            403,
            f"Your API key may not use the model `{model}`.",
            type=ErrorType.PERMISSION,
            param="model",
            code="model_not_allowed",
        )


class ModelNotFound(ApiError):
    def __init__(self, model: str, region: str) -> None:
        super().__init__(
            404,
            f"The model `{model}` is not served in region {region} or any region your "
            "requests may be served in.",
            type=ErrorType.NOT_FOUND,
            param="model",
            code="model_not_found",
        )


class ResidencyRefused(ApiError):
    """451 Unavailable For Legal Reasons (RFC 7725): residency refuses this region."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(451, message, type=ErrorType.PERMISSION, code=code)


class QuotaExceeded(ApiError):
    def __init__(self, message: str, *, reason: str, retry_after_s: float) -> None:
        kind = ErrorType.REQUESTS if reason in ("requests", "concurrency") else ErrorType.TOKENS
        super().__init__(
            429,
            message,
            type=kind,
            code="rate_limit_exceeded",
            retry_after_s=retry_after_s,
        )
        self.reason = reason


class Overloaded(ApiError):
    def __init__(self, message: str, *, reason: str, retry_after_s: float) -> None:
        super().__init__(
            503, message, type=ErrorType.UNAVAILABLE, code=reason, retry_after_s=retry_after_s
        )
        self.reason = reason


class LoopDetected(ApiError):
    """508 Loop Detected (RFC 5842 §7.2): the hop limit between regions was reached."""

    def __init__(self, hops: int, limit: int) -> None:
        super().__init__(
            508,
            f"The request crossed {hops} regional hops; at most {limit} are allowed.",
            type=ErrorType.SERVER,
            code="hop_limit_reached",
        )


class UpstreamFailed(ApiError):
    def __init__(self, message: str, *, retry_after_s: float | None = 1.0) -> None:
        super().__init__(
            502, message, type=ErrorType.SERVER, code="upstream_failed", retry_after_s=retry_after_s
        )

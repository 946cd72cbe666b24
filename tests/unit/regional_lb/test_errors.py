from __future__ import annotations

import pytest

from gtm.errors import GtmError
from regional_lb.errors import (
    ApiError,
    LoopDetected,
    ModelNotAllowed,
    ModelNotFound,
    Overloaded,
    QuotaExceeded,
    RegionalError,
    ResidencyRefused,
    Unauthorized,
    UpstreamFailed,
)


@pytest.mark.parametrize(
    ("error", "status", "kind", "code"),
    [
        (Unauthorized("who"), 401, "authentication_error", "invalid_api_key"),
        (ModelNotAllowed("m"), 403, "permission_error", "model_not_allowed"),
        (ModelNotFound("m", "r1"), 404, "not_found_error", "model_not_found"),
        (ResidencyRefused("no", code="denied"), 451, "permission_error", "denied"),
        (
            QuotaExceeded("slow down", reason="requests", retry_after_s=0.2),
            429,
            "requests",
            "rate_limit_exceeded",
        ),
        (
            QuotaExceeded("slow down", reason="input_tokens", retry_after_s=3.5),
            429,
            "tokens",
            "rate_limit_exceeded",
        ),
        (
            Overloaded("full", reason="queue_full", retry_after_s=2),
            503,
            "service_unavailable",
            "queue_full",
        ),
        (LoopDetected(5, 4), 508, "server_error", "hop_limit_reached"),
        (UpstreamFailed("down"), 502, "server_error", "upstream_failed"),
    ],
)
def test_openai_shaped_errors(error: ApiError, status: int, kind: str, code: str) -> None:
    assert isinstance(error, RegionalError)
    assert isinstance(error, GtmError)
    body = error.body()["error"]
    assert (error.status, body["type"], body["code"]) == (status, kind, code)
    assert body["message"]


def test_retry_after_is_whole_seconds_never_zero() -> None:
    assert QuotaExceeded("x", reason="requests", retry_after_s=0.01).headers() == {
        "Retry-After": "1"
    }
    assert QuotaExceeded("x", reason="requests", retry_after_s=3.2).headers() == {
        "Retry-After": "4"
    }
    assert Unauthorized("x").headers() == {}

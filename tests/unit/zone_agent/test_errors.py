from __future__ import annotations

import pytest

from zone_agent.errors import ApiError, BadRequest, ModelNotFound, NoCapacity


@pytest.mark.parametrize(
    ("error", "status", "type", "code"),
    [
        (BadRequest("bad", param="x"), 400, "invalid_request_error", "invalid_value"),
        (ModelNotFound("m"), 404, "not_found_error", "model_not_found"),
        (NoCapacity("busy", retry_after_s=0.2), 503, "service_unavailable", "no_healthy_gpu"),
    ],
)
def test_openai_error_shape(error: ApiError, status: int, type: str, code: str) -> None:
    body = error.body()
    assert error.status == status
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == type
    assert body["error"]["code"] == code


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert NoCapacity("x", retry_after_s=0.2).headers() == {"Retry-After": "1"}
    assert NoCapacity("x", retry_after_s=2.5).headers() == {"Retry-After": "3"}
    assert BadRequest("x").headers() == {}

import json

import pytest

from gtm.errors import GtmError
from gtm.openai_errors import ApiError, BadRequest, ErrorType, openai_error


def test_body_has_openais_shape() -> None:
    error = ApiError(404, "no such model", type=ErrorType.NOT_FOUND, param="model", code="x")
    assert error.body() == {
        "error": {"message": "no such model", "type": "not_found_error", "param": "model",
                  "code": "x"}
    }  # fmt: skip
    assert isinstance(error, GtmError)


@pytest.mark.parametrize(
    ("retry_after_s", "header"), [(None, None), (0.0, "1"), (0.2, "1"), (2.01, "3"), (5, "5")]
)
def test_retry_after_is_whole_seconds_never_zero(
    retry_after_s: float | None, header: str | None
) -> None:
    error = ApiError(503, "busy", type=ErrorType.UNAVAILABLE, retry_after_s=retry_after_s)
    assert error.headers().get("Retry-After") == header
    assert error.response().headers.get("Retry-After") == header


def test_response_and_helper_serialise_json() -> None:
    response = ApiError(429, "slow down", type=ErrorType.REQUESTS).response(**{"x-a": "b"})
    assert response.status == 429
    assert response.headers["x-a"] == "b"
    assert response.text is not None
    assert json.loads(response.text)["error"]["type"] == "requests"
    plain = openai_error(451, "refused", "residency_refused", "residency:denied")
    assert plain.text is not None
    assert json.loads(plain.text) == {
        "error": {"message": "refused", "type": "residency_refused", "param": None,
                  "code": "residency:denied"}
    }  # fmt: skip


def test_bad_request_is_a_400_naming_the_field() -> None:
    error = BadRequest("bad", param="model")
    assert isinstance(error, ApiError)
    assert isinstance(error, GtmError)
    assert error.status == 400
    assert error.body()["error"] == {
        "message": "bad", "type": "invalid_request_error", "param": "model",
        "code": "invalid_value",
    }  # fmt: skip
    assert BadRequest("x", code="invalid_json").code == "invalid_json"

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gtm.errors import GtmError
from gtm.openai_errors import ApiError, BadRequest, ErrorType, error_middleware, openai_error
from gtm.serve import serving


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


async def _answers(app: web.Application, method: str, path: str) -> tuple[int, dict[str, str], Any]:
    async with (
        serving(app) as bound,
        aiohttp.ClientSession() as session,
        session.request(method, bound.url + path) as response,
    ):
        return response.status, dict(response.headers), await response.json()


def _app(counted: list[tuple[str, int]]) -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    async def bug(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    app = web.Application(
        middlewares=[error_middleware("test service", lambda r, s: counted.append((r, s)))]
    )
    app.router.add_post("/v1/chat/completions", ok)
    app.router.add_get("/bug", bug)
    return app


async def test_unknown_paths_are_openai_404s() -> None:
    counted: list[tuple[str, int]] = []
    status, _, body = await _answers(_app(counted), "GET", "/v1/nope")
    assert status == 404
    assert body == {
        "error": {"message": "Invalid URL (GET /v1/nope)", "type": "not_found_error",
                  "param": None, "code": "unknown_url"}
    }  # fmt: skip
    assert counted == [("unmatched", 404)]


async def test_wrong_methods_are_openai_405s_with_allow() -> None:
    counted: list[tuple[str, int]] = []
    status, headers, body = await _answers(_app(counted), "GET", "/v1/chat/completions")
    assert status == 405
    assert headers["Allow"] == "POST"
    assert body["error"]["code"] == "method_not_allowed"
    assert body["error"]["type"] == "invalid_request_error"
    assert "GET /v1/chat/completions" in body["error"]["message"]
    assert "POST" in body["error"]["message"]


async def test_a_bug_is_an_openai_500_naming_the_service(caplog: pytest.LogCaptureFixture) -> None:
    status, _, body = await _answers(_app([]), "GET", "/bug")
    assert status == 500
    assert body["error"]["message"] == "internal error in the test service"
    assert body["error"]["type"] == "server_error"
    assert [r.message for r in caplog.records] == ["unexpected error handling GET /bug"]

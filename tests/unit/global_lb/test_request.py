"""The front door's reading of a body: a bad one is its 400 in OpenAI's shape, naming the
parameter as every tier does (:mod:`gtm.openai_params`)."""

from __future__ import annotations

import json

import pytest

from global_lb.errors import BadRequest
from global_lb.request import CHAT, COMPLETIONS, DATA_CLASS_HEADER, check_data_class, parse_body

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        (CHAT, {"model": "m", "messages": MESSAGES, "temperature": "abc"}, "temperature",
         "invalid_type"),
        (CHAT, {"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role",
         "invalid_value"),
        (COMPLETIONS, {"model": "m", "prompt": "x", "n": 0}, "n", "integer_below_min_value"),
        (COMPLETIONS, {"prompt": "x"}, "model", "missing_required_parameter"),
    ],
)  # fmt: skip
def test_a_bad_body_is_a_400_naming_the_parameter(
    path: str, body: dict[str, object], param: str, code: str
) -> None:
    with pytest.raises(BadRequest) as info:
        parse_body(path, json.dumps(body).encode())
    response = info.value.response()
    assert response.status == 400
    assert info.value.body()["error"]["param"] == param
    assert info.value.body()["error"]["code"] == code
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_invalid_json_and_a_bad_data_class_are_400s_too() -> None:
    with pytest.raises(BadRequest) as info:
        parse_body(CHAT, b"{")
    assert info.value.code == "invalid_json"
    with pytest.raises(BadRequest) as info:
        check_data_class("Not An Id")
    assert info.value.param == DATA_CLASS_HEADER


def test_a_valid_body_is_read() -> None:
    body = {"model": "m", "messages": MESSAGES, "temperature": 0.2, "max_tokens": 5, "top_k": 4}
    facts = parse_body(CHAT, json.dumps(body).encode())
    assert (facts.model, facts.max_output_tokens, facts.stream) == ("m", 5, False)

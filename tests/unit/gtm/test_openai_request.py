import pytest

from gtm.openai_errors import BadRequest
from gtm.openai_request import MAX_MODEL_NAME, parse_json_body, positive_int, require_model


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|not valid JSON"),
    ],
)
def test_bad_bodies_are_400_invalid_json(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message) as info:
        parse_json_body(raw)
    assert info.value.code == "invalid_json"


def test_model_field() -> None:
    assert require_model({"model": "m"}) == "m"
    for bad in ({}, {"model": ""}, {"model": 3}, {"model": "x" * (MAX_MODEL_NAME + 1)}):
        with pytest.raises(BadRequest) as info:
            require_model(bad)
        assert info.value.param == "model"


def test_positive_int_field() -> None:
    assert positive_int({}, "n") is None
    assert positive_int({"n": 3}, "n", limit=16) == 3
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(BadRequest, match="positive integer"):
            positive_int({"n": bad}, "n")
    with pytest.raises(BadRequest, match="at most 16"):
        positive_int({"n": 17}, "n", limit=16)

import pytest

from gtm.openai_errors import BadRequest
from gtm.openai_request import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MAX_CHOICES,
    MAX_INPUTS,
    MAX_MODEL_NAME,
    parse_json_body,
    read_prompt,
)
from gtm.tokens import count_text_tokens


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
    assert read_prompt({"model": "m", "prompt": "x"}, COMPLETIONS).model == "m"
    for bad in ({}, {"model": ""}, {"model": 3}, {"model": "x" * (MAX_MODEL_NAME + 1)}):
        with pytest.raises(BadRequest) as info:
            read_prompt({**bad, "prompt": "x"}, COMPLETIONS)
        assert info.value.param == "model"


def test_integers_given_as_decimals_or_booleans_are_refused() -> None:
    for bad in (0, -1, True, 1.0, 1.5, "2"):
        with pytest.raises(BadRequest) as info:
            read_prompt({"model": "m", "prompt": "x", "n": bad}, COMPLETIONS)
        assert info.value.param == "n"


def test_a_huge_integer_is_invalid_json_not_an_error_of_ours() -> None:
    """json.loads refuses integers of over 4300 digits with a bare ValueError."""
    with pytest.raises(BadRequest) as info:
        parse_json_body(b'{"n": ' + b"1" * 5000 + b"}")
    assert info.value.code == "invalid_json"


def test_read_prompt_counts_each_prompt_and_keeps_the_first_text() -> None:
    body = {"model": "m", "prompt": ["hello world", [1, 2, 3]], "max_tokens": 5, "n": 2}
    read = read_prompt(body, COMPLETIONS)
    assert read.model == "m"
    assert read.token_counts == (count_text_tokens("hello world"), 3)
    assert read.fingerprint_text == "hello world"
    assert (read.max_output_tokens, read.choices, read.stream) == (5, 2, False)
    tokens = read_prompt({"model": "m", "prompt": [7, 8]}, COMPLETIONS)
    assert (tokens.token_counts, tokens.fingerprint_text) == ((2,), "7 8")


def test_read_prompt_chat_prefers_max_completion_tokens() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 7,
        "max_tokens": 3,
        "stream": True,
    }
    read = read_prompt(body, CHAT)
    assert len(read.token_counts) == 1
    assert read.fingerprint_text == "user\n\nhi\n"
    assert (read.max_output_tokens, read.stream) == (7, True)


def test_read_prompt_embeddings_never_stream_or_fan_out() -> None:
    read = read_prompt({"model": "m", "input": ["a", "b"], "n": 4, "stream": True}, EMBEDDINGS)
    assert (read.max_output_tokens, read.choices, read.stream) == (0, 1, False)
    assert len(read.token_counts) == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "prompt": ""}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": [[]]}, "prompt"),
        ({"model": "m", "prompt": [True]}, "prompt"),
        ({"model": "m", "prompt": ["x"] * (MAX_INPUTS + 1)}, "prompt"),
        ({"model": "m", "prompt": "x", "n": MAX_CHOICES + 1}, "n"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x"}, "model"),
    ],
)
def test_read_prompt_refuses_naming_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(BadRequest) as info:
        read_prompt(body, COMPLETIONS)
    assert info.value.param == param

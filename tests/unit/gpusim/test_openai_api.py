from __future__ import annotations

import base64
import json
import struct

import pytest
from pydantic import ValidationError

from gpusim import openai_api as api


def _events(text: str) -> list[object]:
    assert text.endswith("\n\n")
    chunks = [part for part in text.split("\n\n") if part]
    assert all(chunk.startswith("data: ") for chunk in chunks)
    return [json.loads(chunk.removeprefix("data: ")) for chunk in chunks]


def test_chat_chunks_are_valid_openai_json() -> None:
    renderer = api.ChunkRenderer(
        api.Kind.CHAT, response_id="chatcmpl-1", created=7, model='m"x', include_usage=True
    )
    first, second, finish = _events(
        renderer.token(0, "Hi", True)
        + renderer.token(0, ' "q"', False)
        + renderer.finish(0, "stop")
    )
    assert first == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": 'm"x',
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": "Hi"},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "usage": None,
    }
    assert second["choices"][0]["delta"] == {"content": ' "q"'}  # type: ignore[index]
    assert finish["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    (usage,) = _events(renderer.usage(api.usage(3, 2, 1)))
    assert usage["choices"] == []  # type: ignore[index]
    assert usage["usage"] == {  # type: ignore[index]
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1},
    }


def test_completion_chunks_carry_text() -> None:
    renderer = api.ChunkRenderer(
        api.Kind.COMPLETION, response_id="cmpl-1", created=1, model="m", include_usage=False
    )
    (token,) = _events(renderer.token(2, "x", True))
    assert token["object"] == "text_completion"  # type: ignore[index]
    assert token["choices"] == [  # type: ignore[index]
        {"index": 2, "text": "x", "logprobs": None, "finish_reason": None}
    ]
    assert "usage" not in token  # type: ignore[operator]
    (finish,) = _events(renderer.finish(2, "length"))
    assert finish["choices"][0]["text"] == ""  # type: ignore[index]


def test_non_streaming_bodies() -> None:
    chat = api.completion_body(
        api.Kind.CHAT,
        response_id="c",
        created=1,
        model="m",
        choices=[("hello", "stop")],
        usage_body=api.usage(1, 1, 0),
    )
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    text = api.completion_body(
        api.Kind.COMPLETION,
        response_id="c",
        created=1,
        model="m",
        choices=[("a", "stop"), ("b", "length")],
        usage_body=api.usage(1, 2, 0),
    )
    assert [c["text"] for c in text["choices"]] == ["a", "b"]


def test_error_shape() -> None:
    error = api.ApiError(404, "no such model", type=api.ErrorType.NOT_FOUND, param="model")
    assert error.body() == {
        "error": {
            "message": "no such model",
            "type": "not_found_error",
            "param": "model",
            "code": None,
        }
    }
    with pytest.raises(ValidationError) as info:
        api.ChatCompletionRequest.model_validate({"model": "m", "messages": [], "n": 0})
    converted = api.validation_error(info.value)
    assert converted.status == 400
    assert converted.param in {"messages", "n"}


def test_requests_ignore_unknown_fields_and_check_known_ones() -> None:
    body = api.ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "temperature": 0.2,
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "stream_options": {"include_usage": True},
        }
    )
    assert body.output_limit == 7
    assert body.include_usage
    assert not body.stream
    for bad in ({"stream": "yes"}, {"max_tokens": 0}, {"n": 17}, {"model": ""}):
        with pytest.raises(ValidationError):
            api.ChatCompletionRequest.model_validate(
                {"model": "m", "messages": [{"role": "user"}], **bad}
            )


@pytest.mark.parametrize(
    ("raw", "items"),
    [
        ("text", ["text"]),
        ([1, 2, 3], [[1, 2, 3]]),
        (["a", "b"], ["a", "b"]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_prompt_items(
    raw: str | list[int] | list[str] | list[list[int]], items: list[object]
) -> None:
    assert api.prompt_items(raw, "prompt") == items


@pytest.mark.parametrize("raw", [[], [""], [[]]])
def test_empty_prompts_are_refused(raw: list[str] | list[list[int]]) -> None:
    with pytest.raises(api.ApiError, match="must not be empty"):
        api.prompt_items(raw, "input")


def test_token_ids_must_be_int32() -> None:
    with pytest.raises(ValidationError):
        api.CompletionRequest.model_validate({"model": "m", "prompt": [2**31]})
    with pytest.raises(ValidationError):
        api.CompletionRequest.model_validate({"model": "m", "prompt": [-1]})


def test_embedding_items_in_float_and_base64() -> None:
    vector = [0.5, -0.25, 1.0]
    assert api.embedding_item(1, vector, "float") == {
        "object": "embedding",
        "index": 1,
        "embedding": vector,
    }
    encoded = api.embedding_item(0, vector, "base64")["embedding"]
    assert list(struct.unpack("<3f", base64.b64decode(encoded))) == vector

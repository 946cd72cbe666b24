"""The OpenAI wire format the emulator speaks: request bodies, responses, SSE chunks, errors.

Request bodies are validated with pydantic but unknown fields are ignored, as OpenAI-
compatible servers do (``temperature``, ``top_p``, ``user``... do not change what the
emulator does). vLLM's ``ignore_eos`` extension is honoured: with it, a request always
generates ``max_tokens`` tokens.

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
import functools
import json
import struct
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

# The error shape every tier answers with; re-exported for the server.
from gtm.openai_errors import ApiError as ApiError
from gtm.openai_errors import ErrorType as ErrorType

#: Largest token id accepted in a token-id prompt (ids are int32 in every engine).
MAX_TOKEN_ID = 2**31 - 1
#: Most choices (``n``) or prompts/inputs per request we accept.
MAX_CHOICES = 16
MAX_INPUTS = 2048

PositiveInt = Annotated[int, Field(ge=1)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


def validation_error(exc: ValidationError) -> ApiError:
    """The first problem of a pydantic validation error, as a 400."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return ApiError(
        400,
        f"{where or 'body'}: {first['msg']}",
        param=str(first["loc"][0]) if first["loc"] else None,
        code="invalid_value",
    )


# ---------------------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    include_usage: StrictBool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str = Field(min_length=1, max_length=256)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    ignore_eos: StrictBool = False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_GenerationRequest):
    messages: list[Any] = Field(min_length=1)
    max_completion_tokens: PositiveInt | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_GenerationRequest):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str = Field(min_length=1, max_length=256)
    input: str | list[TokenId] | list[str] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None


def prompt_items(
    raw: str | list[int] | list[str] | list[list[int]], field: str
) -> list[str | list[int]]:
    """Split an OpenAI ``prompt``/``input`` into one item per prompt (text or token ids)."""
    if isinstance(raw, str):
        items: list[str | list[int]] = [raw]
    elif not raw:
        raise ApiError(400, f"{field} must not be empty", param=field, code="invalid_value")
    elif all(isinstance(x, int) for x in raw):
        items = [[int(x) for x in raw if isinstance(x, int)]]
    else:
        items = [x for x in raw if isinstance(x, str | list)]
    if len(items) > MAX_INPUTS:
        raise ApiError(400, f"at most {MAX_INPUTS} items in {field}", param=field)
    for item in items:
        if not item:
            raise ApiError(
                400, f"{field} items must not be empty", param=field, code="invalid_value"
            )
    return items


# ---------------------------------------------------------------------------- responses


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class Kind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"


def completion_body(
    kind: Kind,
    *,
    response_id: str,
    created: int,
    model: str,
    choices: Sequence[tuple[str, str]],
    usage_body: Mapping[str, Any],
) -> dict[str, Any]:
    """A non-streaming response; ``choices`` are (text, finish_reason) in index order."""
    if kind is Kind.CHAT:
        rendered = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
            for i, (text, reason) in enumerate(choices)
        ]
        obj = "chat.completion"
    else:
        rendered = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
            for i, (text, reason) in enumerate(choices)
        ]
        obj = "text_completion"
    return {
        "id": response_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": rendered,
        "usage": dict(usage_body),
    }


@functools.lru_cache(maxsize=4096)
def _quoted(text: str) -> str:
    """``json.dumps`` of a token's text, memoised: generated tokens come from a small
    vocabulary, and this runs once per streamed token."""
    return json.dumps(text)


class ChunkRenderer:
    """Server-sent events of one streaming response, rendered from string templates.

    The per-request prefix and suffix of every chunk are built once, so a token costs
    one ``json.dumps`` of its text and a few concatenations (the emulator streams
    thousands of tokens per second from one event loop).
    """

    def __init__(
        self, kind: Kind, *, response_id: str, created: int, model: str, include_usage: bool
    ):
        self._kind = kind
        obj = "chat.completion.chunk" if kind is Kind.CHAT else "text_completion"
        self._head = (
            f'data: {{"id":{json.dumps(response_id)},"object":"{obj}","created":{created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":'
        )
        self._tail = "}]" + (',"usage":null' if include_usage else "") + "}\n\n"
        self._usage_head = self._head.removesuffix('[{"index":') + "[],"

    def token(self, index: int, text: str, first: bool) -> str:
        if self._kind is Kind.CHAT:
            role = '"role":"assistant",' if first else ""
            delta = f'"delta":{{{role}"content":{_quoted(text)}}}'
            body = f'{delta},"logprobs":null,"finish_reason":null'
        else:
            body = f'"text":{_quoted(text)},"logprobs":null,"finish_reason":null'
        return f"{self._head}{index},{body}{self._tail}"

    def finish(self, index: int, reason: str) -> str:
        content = '"delta":{}' if self._kind is Kind.CHAT else '"text":""'
        return (
            f'{self._head}{index},{content},"logprobs":null,"finish_reason":"{reason}"{self._tail}'
        )

    def usage(self, body: Mapping[str, Any]) -> str:
        return f'{self._usage_head}"usage":{json.dumps(body)}}}\n\n'


DONE = "data: [DONE]\n\n"


def embedding_item(index: int, vector: Sequence[float], encoding: str) -> dict[str, Any]:
    """One ``data`` item; base64 is little-endian float32, as OpenAI encodes it."""
    value: list[float] | str
    if encoding == "base64":
        value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    else:
        value = list(vector)
    return {"object": "embedding", "index": index, "embedding": value}

"""Reading OpenAI request bodies the same way at every tier.

Each tier reads only what its decision needs (model, token counts, ``n``, ``stream``);
what is shared is how a body is parsed and how a bad field is reported: a 400 in
OpenAI's shape naming the field (:class:`gtm.openai_errors.BadRequest`).
:func:`read_prompt` is the one reading of what a request asks for — its prompts' token
counts (with :mod:`gtm.tokens`, the estimate every tier and the GPU emulator charge
with), the text its prefix fingerprints are taken from, its output budget, ``n`` and
``stream`` — so the regional LB and the zone agent cannot disagree on a body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gtm.http_limits import MAX_JSON_DEPTH, json_too_deep
from gtm.openai_errors import BadRequest
from gtm.tokens import PromptError, count_chat_tokens, count_text_tokens, parse_chat_messages

#: Longest model name accepted (matches :data:`gtm.models.ModelName`).
MAX_MODEL_NAME = 256
#: Most choices (``n``) and prompts per request (as the emulator and vLLM's defaults).
MAX_CHOICES = 16
MAX_INPUTS = 2048

#: The endpoints every tier serves.
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


def parse_json_body(raw: bytes) -> Mapping[str, object]:
    """The body as a JSON object, or a 400 saying why not."""
    if json_too_deep(raw, MAX_JSON_DEPTH):  # checked first: json.loads recurses
        raise BadRequest(
            f"the request body is nested too deeply (over {MAX_JSON_DEPTH} levels)",
            code="invalid_json",
        )
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    except RecursionError:
        raise BadRequest("the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    return body


def require_model(body: Mapping[str, object]) -> str:
    """The ``model`` field: a non-empty string of at most :data:`MAX_MODEL_NAME` characters."""
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL_NAME:
        raise BadRequest(
            f"model must be a non-empty string of at most {MAX_MODEL_NAME} characters",
            param="model",
        )
    return model


def positive_int(body: Mapping[str, object], name: str, limit: int | None = None) -> int | None:
    """An optional positive integer field (``None`` when absent); booleans are refused."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{name} must be a positive integer", param=name)
    if limit is not None and value > limit:
        raise BadRequest(f"{name} must be at most {limit}", param=name)
    return value


@dataclass(frozen=True, slots=True)
class PromptRead:
    """What a body asks for, as every tier reads it. Holds the text fingerprints are
    taken from (the first prompt's), never more."""

    model: str
    #: Tokens of each prompt (a chat is one prompt; a completions ``prompt`` may hold
    #: several; each embeddings ``input`` is one).
    token_counts: tuple[int, ...]
    #: The text the first prompt's prefix fingerprints are taken from.
    fingerprint_text: str
    #: ``max_completion_tokens`` / ``max_tokens`` per sequence when given (embeddings: 0).
    max_output_tokens: int | None
    #: ``n`` (1 when absent, and for embeddings).
    choices: int
    #: ``stream`` (never for embeddings).
    stream: bool


def read_prompt(body: Mapping[str, object], path: str) -> PromptRead:
    """Validate what a decision needs from a body sent to ``path`` (one of
    :data:`CHAT`, :data:`COMPLETIONS`, :data:`EMBEDDINGS`); the worker validates the rest.

    Raises:
        BadRequest: a field a decision reads is missing or malformed (the message and
            ``param`` name it).
    """
    model = require_model(body)
    if path == CHAT:
        counts, text = _chat_prompt(body)
        output = positive_int(body, "max_completion_tokens") or positive_int(body, "max_tokens")
    elif path == COMPLETIONS:
        counts, text = _items_prompt(body.get("prompt"), "prompt")
        output = positive_int(body, "max_tokens")
    else:
        counts, text = _items_prompt(body.get("input"), "input")
        output = 0
    embedding = path == EMBEDDINGS
    choices = 1 if embedding else (positive_int(body, "n", MAX_CHOICES) or 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    return PromptRead(model, counts, text, output, choices, stream and not embedding)


def _chat_prompt(body: Mapping[str, object]) -> tuple[tuple[int, ...], str]:
    try:
        messages = parse_chat_messages(body.get("messages"))
    except PromptError as exc:
        raise BadRequest(str(exc), param="messages") from None
    text = "".join(f"{m.role}\n{m.name or ''}\n{m.text}\n" for m in messages)
    return (count_chat_tokens(messages),), text


def _items_prompt(value: object, field: str) -> tuple[tuple[int, ...], str]:
    """``prompt`` / ``input``: a string, token ids, a list of strings or of token-id lists."""
    items: list[str | list[object]]
    single = isinstance(value, str) or (
        isinstance(value, list) and value and all(_is_token(x) for x in value)
    )
    if single:
        items = [value]  # type: ignore[list-item]
    elif isinstance(value, list) and value:
        if not all(
            isinstance(x, str) or (isinstance(x, list) and all(map(_is_token, x))) for x in value
        ):
            raise BadRequest(
                f"{field} must be a string, a list of strings, token ids or lists of token ids",
                param=field,
            )
        items = list(value)
    else:
        raise BadRequest(f"{field} must be a non-empty string or list", param=field)
    if len(items) > MAX_INPUTS:
        raise BadRequest(f"at most {MAX_INPUTS} items in {field}", param=field)
    counts: list[int] = []
    for item in items:
        count = count_text_tokens(item) if isinstance(item, str) else len(item)
        if count == 0 and (not isinstance(item, str) or not item):
            raise BadRequest(f"{field} items must not be empty", param=field)
        counts.append(count)
    first = items[0]
    text = first if isinstance(first, str) else " ".join(str(t) for t in first)
    return tuple(counts), text


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31

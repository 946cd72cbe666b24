"""Reading OpenAI request bodies the same way at every tier.

Each tier reads only what its decision needs (model, token counts, ``n``, ``stream``);
what is shared is how a body is parsed, which parameters are refused (types and ranges
as OpenAI checks them, :mod:`gtm.openai_params`) and how a bad one is reported: a 400 in
OpenAI's shape naming the parameter (:class:`gtm.openai_errors.BadRequest`).
:func:`read_prompt` is the one reading of what a request asks for — its prompts' token
counts (with :mod:`gtm.tokens`, the estimate every tier and the GPU emulator charge
with), the text its prefix fingerprints are taken from, its output budget, ``n`` and
``stream`` — so the regional LB and the zone agent cannot disagree on a body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import NamedTuple

import msgspec

from gtm.http_limits import MAX_JSON_DEPTH, json_too_deep
from gtm.openai_errors import BadRequest
from gtm.openai_params import CHAT as CHAT
from gtm.openai_params import COMPLETIONS as COMPLETIONS
from gtm.openai_params import EMBEDDINGS as EMBEDDINGS
from gtm.openai_params import MAX_CHOICES as MAX_CHOICES
from gtm.openai_params import MAX_MODEL_NAME as MAX_MODEL_NAME
from gtm.openai_params import check_params, empty_array, invalid_type
from gtm.tokens import PromptError, chat_prompt, count_text_tokens

#: Most prompts (or embeddings inputs) per request.
MAX_INPUTS = 2048
#: What ``prompt`` and ``input`` may be, as OpenAI's type errors say it.
_PROMPT_TYPES = (
    "one of a string, array of strings, array of integers, or array of arrays of integers"
)


def parse_json_body(raw: bytes) -> Mapping[str, object]:
    """The body as a JSON object, or a 400 saying why not."""
    if json_too_deep(raw, MAX_JSON_DEPTH):  # checked first: json.loads recurses
        raise BadRequest(
            f"the request body is nested too deeply (over {MAX_JSON_DEPTH} levels)",
            code="invalid_json",
        )
    try:
        body = _decode(raw)
    except Exception:  # whatever msgspec refuses, json.loads answers
        body = _loads(raw)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    return body


def _loads(raw: bytes) -> object:
    """``json.loads``: the reference reading of a body, and its errors' words."""
    try:
        return json.loads(raw)
    except ValueError as exc:  # undecodable, not JSON, or an integer of over 4300 digits
        raise BadRequest(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    except RecursionError:
        raise BadRequest("the request body is nested too deeply", code="invalid_json") from None


#: msgspec's JSON decoder reads a body several times faster than ``json.loads``, and
#: whatever it reads it reads as ``json.loads`` does (the same values and types, keys in
#: the same order, the last of a repeated key; pinned by a property test). What it
#: refuses goes to ``json.loads``, which answers as it always did: a body only it reads
#: (``NaN``, ``Infinity``, a number beyond a float's range, a lone surrogate, a leading
#: byte-order mark, UTF-16 or UTF-32) or the error message of one that is not JSON.
_decode = msgspec.json.Decoder().decode


class PromptRead(NamedTuple):
    """What a body asks for, as every tier reads it. Holds the text fingerprints are
    taken from (the first prompt's), never more. (Immutable and typed as a frozen
    dataclass, and built for every request at a fraction of one's cost.)"""

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
    """Check ``body``'s parameters as OpenAI does (:func:`gtm.openai_params.check_params`)
    and read what a decision needs from it, for ``path`` (one of :data:`CHAT`,
    :data:`COMPLETIONS`, :data:`EMBEDDINGS`). Every tier reads a body here, once.

    Raises:
        BadRequest: a parameter is missing or malformed (``param`` names it, the
            message is OpenAI's).
    """
    check_params(body, path)
    model = str(body["model"])  # checked: a string
    get = body.get
    # The integer parameters are checked (an integer, or absent as None) and read inline:
    # a call per parameter read would cost more than the reading.
    if path == CHAT:
        try:
            tokens, text = chat_prompt(get("messages"))
        except PromptError as exc:
            raise BadRequest(str(exc), param="messages") from None
        counts: tuple[int, ...] = (tokens,)
        given = get("max_completion_tokens")
        if given is None or not isinstance(given, int) or not given:
            given = get("max_tokens")
    elif path == COMPLETIONS:
        counts, text = _items_prompt(get("prompt"), "prompt")
        given = get("max_tokens")
    else:
        counts, text = _items_prompt(get("input"), "input")
        return _new_tuple(PromptRead, (model, counts, text, 0, 1, False))
    # Exact ints and absent values (the usual ones) told apart without isinstance calls.
    output = given if type(given) is int or isinstance(given, int) else None
    n = get("n")
    choices = n if n is not None and isinstance(n, int) and n else 1
    # The tuple made directly, in the fields' order (the named tuple's ``__new__`` is a
    # Python function around this same call).
    return _new_tuple(PromptRead, (model, counts, text, output, choices, get("stream") is True))


_new_tuple = tuple.__new__


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
            raise invalid_type(field, _PROMPT_TYPES, value)
        items = list(value)
    elif isinstance(value, list):
        raise empty_array(field)
    else:
        raise invalid_type(field, _PROMPT_TYPES, value)
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

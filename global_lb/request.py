"""What the front door reads from an OpenAI-compatible request: model, size, headers.

Only what region choice needs: the model, the prompt's size in tokens (estimated with
:mod:`gtm.tokens`, the same estimate every tier and the GPU emulator use), the output
budget, the data class and the hop count. The body itself is forwarded untouched.

Inter-tier headers the front door reads or sets::

    x-gtm-hops             tiers crossed so far (a loop past the limit is a 508)
    x-gtm-data-class       the request's data class (residency), default "default"
    x-gtm-client-country   the client's country as located here (a client's own dropped)
    x-gtm-region           the region that served the request (the regional LB's own)
    x-gtm-decision-id      the decision's id, in both directions
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from global_lb.errors import BadRequest
from gtm import headers as gtm_headers
from gtm.openai_errors import ApiError
from gtm.openai_request import parse_json_body
from gtm.tokens import (
    PromptError,
    count_chat_tokens,
    count_text_tokens,
    parse_chat_messages,
)
from policies.types import is_identifier

# The inter-tier headers the front door reads or sets (their one list: gtm.headers).
HOPS_HEADER = gtm_headers.HOPS
REGION_HEADER = gtm_headers.REGION
DECISION_HEADER = gtm_headers.DECISION_ID
DATA_CLASS_HEADER = gtm_headers.DATA_CLASS
#: Set only by the front door: a client's own value is dropped, or a client could claim
#: a country whose rules suit it.
CLIENT_COUNTRY_HEADER = gtm_headers.CLIENT_COUNTRY
FORWARDED_FOR_HEADER = "X-Forwarded-For"


#: Endpoints the front door forwards (ARCHITECTURE §6).
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"


@dataclass(frozen=True, slots=True)
class RequestFacts:
    model: str
    input_tokens: int
    max_output_tokens: int
    stream: bool


def parse_body(path: str, body: bytes) -> RequestFacts:
    try:
        data = parse_json_body(body)  # the shared parser: depth-limited, never recurses out
    except ApiError as exc:
        raise BadRequest(exc.message) from None
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string")
    try:
        tokens = _input_tokens(path, data)
    except PromptError as exc:
        raise BadRequest(str(exc)) from None
    limit = data.get("max_completion_tokens", data.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise BadRequest("'max_tokens' must be a non-negative integer")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    return RequestFacts(model, tokens, int(limit or 0), stream)


def _input_tokens(path: str, data: Mapping[str, object]) -> int:
    if path == CHAT:
        return count_chat_tokens(parse_chat_messages(data.get("messages")))
    field = "prompt" if path == COMPLETIONS else "input"
    return _count_inputs(data.get(field), field)


def _count_inputs(value: object, field: str) -> int:
    if isinstance(value, str):
        return count_text_tokens(value)
    if isinstance(value, list):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return len(value)  # already token ids
        return sum(_count_inputs(v, field) for v in value)
    raise BadRequest(f"{field!r} must be a string, an array of strings or of token ids")


def check_data_class(value: str) -> None:
    """A data class header must be a lowercase id (400 otherwise)."""
    if not is_identifier(value):
        raise BadRequest(f"{DATA_CLASS_HEADER} must be a lowercase id, got {value!r}")


def hops(value: str | None) -> int:
    """The hop count of ``x-gtm-hops`` (absent or garbled: 0)."""
    if value is None:
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        return 0

"""Reading OpenAI request bodies the same way at every tier.

Each tier reads only what its decision needs (model, token counts, ``n``, ``stream``);
what is shared is how a body is parsed and how a bad field is reported: a 400 in
OpenAI's shape naming the field (:class:`gtm.openai_errors.BadRequest`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gtm.http_limits import MAX_JSON_DEPTH, json_too_deep
from gtm.openai_errors import BadRequest

#: Longest model name accepted (matches :data:`gtm.models.ModelName`).
MAX_MODEL_NAME = 256


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

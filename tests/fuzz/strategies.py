"""Strategies shared by the fuzz tests: arbitrary JSON, and mutations of valid requests."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=16)
)

#: Any JSON value, a few levels deep.
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=6,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EMBEDDING_MODEL = "BAAI/bge-large-en-v1.5"

VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    },
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"model": EMBEDDING_MODEL, "input": "hi"},
}

#: Field names the servers read, so mutations hit the validation paths.
FIELDS = (
    "model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "n",
    "stream", "stream_options", "temperature", "stop", "user", "seed", "role", "content",
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any]) -> dict[str, Any]:
    """``valid`` with a few fields removed, replaced by any JSON, or added."""
    body: dict[str, Any] = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        key = draw(st.sampled_from(FIELDS))
        action = draw(st.sampled_from(("set", "drop", "nest")))
        if action == "drop":
            body.pop(key, None)
        elif action == "set":
            body[key] = draw(JSON)
        elif isinstance(body.get("messages"), list) and body["messages"]:
            first = body["messages"][0]
            if isinstance(first, dict):
                first[key] = draw(JSON)
    return body


@st.composite
def http_body(draw: st.DrawFn, path: str) -> bytes:
    """A body for ``path``: a mutated valid request, any JSON, or raw bytes."""
    kind = draw(st.sampled_from(("mutated", "json", "bytes", "truncated")))
    if kind == "mutated":
        return json.dumps(draw(mutated(VALID[path]))).encode()
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    text = json.dumps(draw(mutated(VALID[path]))).encode()
    return text[: draw(st.integers(min_value=0, max_value=len(text)))]

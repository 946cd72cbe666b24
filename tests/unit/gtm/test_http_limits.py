"""The JSON depth scan and the limits model (no sockets; the middleware is exercised
over real sockets in tests/integration/security/test_limits_http.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gtm.http_limits import MAX_JSON_DEPTH, HttpLimits, json_too_deep
from gtm.openai_errors import BadRequest
from gtm.openai_request import parse_json_body


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(value=JSON, limit=st.integers(min_value=0, max_value=8))
def test_scan_agrees_with_the_real_depth(value: Any, limit: int) -> None:
    """Strings full of brackets, quotes and backslashes never fool the scan."""
    raw = json.dumps(value).encode()
    assert json_too_deep(raw, limit) == (_depth(value) > limit)


def test_scan_handles_edge_cases() -> None:
    assert not json_too_deep(b"", 1)
    assert json_too_deep(b"[[[", 2)  # unterminated is still counted
    assert not json_too_deep(b'["\\"[[[[[[[["]', 1)  # escaped quote inside a string
    assert json_too_deep(b"[" * 100_000 + b"]" * 100_000, MAX_JSON_DEPTH)
    assert not json_too_deep(b"]]]]]]]]]]", 1)  # stray closers never go negative


def test_parse_json_body_refuses_deep_bodies_before_parsing() -> None:
    deep = b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(BadRequest, match="nested too deeply") as info:
        parse_json_body(deep)
    assert info.value.code == "invalid_json"
    ok = b'{"a":' * MAX_JSON_DEPTH + b"1" + b"}" * MAX_JSON_DEPTH
    assert parse_json_body(ok)


def test_limits_defaults_and_handler_args() -> None:
    limits = HttpLimits()
    assert limits.max_headers == 100
    assert limits.max_header_line_bytes == 8190
    args = limits.handler_args()
    # The parser's hard ceilings sit above the limits the middleware answers 431 for.
    assert args["max_headers"] > limits.max_headers
    assert args["max_field_size"] >= limits.max_header_line_bytes
    assert args["keepalive_timeout"] == limits.header_timeout_s
    assert args["lingering_time"] == limits.lingering_s
    with pytest.raises(ValidationError):
        HttpLimits(header_timeout_s=0)
    with pytest.raises(ValidationError):
        HttpLimits(max_concurrent_per_client=-1)

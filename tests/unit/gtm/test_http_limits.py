"""The JSON depth scan and the limits model (no sockets; the middleware is exercised
over real sockets in tests/integration/security/test_limits_http.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gtm.http_limits import (
    MAX_JSON_DEPTH,
    HttpLimits,
    body_too_deep,
    fields_fit,
    header_problem,
    json_too_deep,
)
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


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    raw=st.one_of(
        st.text(alphabet=' \t"\\[]{}a', max_size=40).map(str.encode),
        JSON.map(lambda value: json.dumps(value).encode()),
    ),
    limit=st.integers(min_value=2, max_value=6),
)
def test_body_too_deep_is_a_json_body_over_the_depth(raw: bytes, limit: int) -> None:
    """Its shortcut (the bracket count first) answers as the rule it stands for: a body
    that starts as JSON arrays or objects and nests deeper than the limit."""
    limits = HttpLimits(max_json_depth=limit)
    expected = raw.lstrip()[:1] in (b"{", b"[") and json_too_deep(raw, limit)
    assert (body_too_deep(raw, limits) is not None) == expected


_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=40)
_VALUE = st.one_of(
    st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"").strip()),
    st.integers(min_value=0, max_value=1100).map(lambda n: b"v" * n),  # near the limits
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    fields=st.lists(st.tuples(_TOKEN, _VALUE, st.booleans()), max_size=12),
    line=st.integers(min_value=256, max_value=1024),
    total=st.integers(min_value=1024, max_value=2048),
)
def test_a_head_within_fields_fit_has_no_field_problem(
    fields: list[tuple[str, bytes, bool]], line: int, total: int
) -> None:
    """The lean server scans the fields only for a head over :func:`fields_fit` (its
    bytes plus one per field): under it, header_problem finds nothing but the count,
    whether or not a space follows each colon."""
    limits = HttpLimits(max_headers=8, max_header_line_bytes=line, max_header_bytes=total)
    parsed = [(name.encode(), value) for name, value, _ in fields]
    head = b"POST /v1/chat/completions HTTP/1.1\r\n" + b"".join(
        name.encode() + (b": " if spaced else b":") + value + b"\r\n"
        for name, value, spaced in fields
    )
    head += b"\r\n"
    if len(head) + len(fields) <= fields_fit(limits) and len(fields) <= limits.max_headers:
        assert header_problem(parsed, limits) is None


def test_fields_fit_is_tight_enough_to_refuse_a_long_line() -> None:
    limits = HttpLimits(max_header_line_bytes=256, max_header_bytes=1024)
    long = [(b"x", b"v" * 252)]  # 257 bytes as counted: over the line limit
    assert header_problem(long, limits) is not None
    assert len(b"x: " + b"v" * 252 + b"\r\n") + 1 > fields_fit(limits)


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

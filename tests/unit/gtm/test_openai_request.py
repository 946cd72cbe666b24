import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

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
from tests.fuzz.strategies import JSON


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


def test_the_depth_scan_refuses_past_the_limit() -> None:
    # 65 levels of objects under a JSON object: json.loads reads it, the scan refuses it.
    raw = b'{"a":' * 65 + b"1" + b"}" * 65
    with pytest.raises(BadRequest, match="nested too deeply") as info:
        parse_json_body(raw)
    assert info.value.code == "invalid_json"
    at_limit = b'{"a":' * 64 + b"1" + b"}" * 64
    assert parse_json_body(at_limit) == json.loads(at_limit)


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


def _reference(raw: bytes) -> tuple[str, object]:
    """What ``parse_json_body`` answered when it read with ``json.loads`` alone."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        return "400", f"the request body is not valid JSON: {exc}"
    except RecursionError:
        return "400", "the request body is nested too deeply"
    if not isinstance(body, dict):
        return "400", "the request body must be a JSON object"
    return "ok", repr(body)  # repr tells 1, 1.0 and True apart, and shows the keys' order


def _answer(raw: bytes) -> tuple[str, object]:
    try:
        return "ok", repr(parse_json_body(raw))
    except BadRequest as exc:
        return "400", exc.message


#: Bodies only json.loads reads, and JSON msgspec reads its own way unless told apart.
_EDGES = [
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',
    b'{"a": 1e400, "b": -1e400, "c": 1e-400, "d": -0.0, "e": -0}',
    b'{"a": "\\ud800", "b": "\\udc00\\ud800", "c": "\\ud83d\\ude00"}',
    b'{"a": "\xed\xa0\x80"}',  # a surrogate's UTF-8 bytes
    b'\xef\xbb\xbf{"a": 1}',  # a byte-order mark
    '{"a": 1}'.encode("utf-16-le"),
    '{"a": 1}'.encode("utf-32"),
    b'{"a": 1, "b": 2, "a": 3}',
    b'{"n": ' + b"1" * 4300 + b"}",
    b'{"n": ' + b"1" * 4301 + b"}",
    b'{"a": 0.1000000000000000055511151231257827021181583404541015625000001}',
    b'{"a": 9007199254740993, "b": -9223372036854775809, "c": 18446744073709551616}',
    b'{"a": 4.9e-324, "b": 2.4703282292062327e-324, "c": 1.7976931348623157e308}',
    b'{"a": 01}',
    b'{"a": 1.}',
    b'{"a": .5}',
    b'{"a": +1}',
    b'{"a": "\\a"}',
    b'{"a": "\x01"}',
    b'\x0c{"a": 1}',
    b'{"a": 1} x',
    b'{"a": 1}}',
    b'{"a" : 1 ,"b":[ ] }',
    b"",
    b"\xff",
]


@pytest.mark.parametrize("raw", _EDGES)
def test_a_body_is_read_as_json_loads_reads_it_at_its_edges(raw: bytes) -> None:
    assert _answer(raw) == _reference(raw)


_FLOATS = st.floats(allow_nan=False, allow_infinity=False).map(repr) | st.from_regex(
    r"\A-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,30})?([eE][-+]?[0-9]{1,3})?\Z"
).map(str)


@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=8), JSON, max_size=6),
    numbers=st.lists(_FLOATS, max_size=6),
    cut=st.integers(min_value=0, max_value=200),
    flip=st.integers(min_value=0, max_value=255),
)
@example(value={"a": 1}, numbers=["1e999", "-0", "1E+2"], cut=0, flip=0)
def test_a_body_is_read_as_json_loads_reads_it(
    value: dict[str, object], numbers: list[str], cut: int, flip: int
) -> None:
    """The fast reading (msgspec) and ``json.loads`` agree on every body: the same
    values of the same types in the same order, or the same 400."""
    raw = json.dumps({**value, "numbers": "@"}, ensure_ascii=cut % 2 == 0).encode()
    raw = raw.replace(b'"@"', ("[" + ",".join(numbers) + "]").encode())
    assert _answer(raw) == _reference(raw)
    if raw:  # a byte changed somewhere: mostly not JSON any more, or another value
        at = cut % len(raw)
        broken = raw[:at] + bytes([flip]) + raw[at + 1 :]
        assert _answer(broken) == _reference(broken)

"""Each OpenAI parameter: valid values pass, each wrong type or range is a 400 naming the
parameter in OpenAI's words (the messages are the ones OpenAI answers with)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gtm import openai_params
from gtm.openai_errors import BadRequest
from gtm.openai_params import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MAX_CHOICES,
    MAX_LOGIT_BIAS,
    check_params,
)
from tests.fuzz.strategies import JSON

BASE: dict[str, dict[str, Any]] = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"model": "m", "prompt": "hi"},
    EMBEDDINGS: {"model": "m", "input": "hi"},
}
BOTH = (CHAT, COMPLETIONS)

#: (endpoints, parameter, values OpenAI accepts).
VALID: list[tuple[tuple[str, ...], str, list[Any]]] = [
    (BOTH, "temperature", [0, 0.7, 1, 2, 2.0, None]),
    (BOTH, "top_p", [0, 0.5, 1]),
    (BOTH, "n", [1, MAX_CHOICES]),
    (BOTH, "max_tokens", [1, 10**6]),
    ((CHAT,), "max_completion_tokens", [1, 4096]),
    (BOTH, "stream", [True, False]),
    (BOTH, "stop", ["\n", [], ["a"], ["a", "b", "c", "d"]]),
    (BOTH, "presence_penalty", [-2, 0, 1.5, 2]),
    (BOTH, "frequency_penalty", [-2.0, 2]),
    (BOTH, "logit_bias", [{}, {"50256": -100}, {"1": 100, "2": 0.5}]),
    (BOTH, "seed", [0, -1, 2**63 - 1]),
    (BOTH, "user", ["u-1", ""]),
    ((CHAT,), "logprobs", [True, False]),
    ((COMPLETIONS,), "logprobs", [0, 5]),
    ((COMPLETIONS,), "echo", [True]),
    ((COMPLETIONS,), "best_of", [1, 20]),
    ((COMPLETIONS,), "suffix", ["end"]),
    ((CHAT,), "response_format", [{"type": "text"}, {"type": "json_object"}]),
    ((CHAT,), "response_format", [{"type": "json_schema", "json_schema": {"name": "s"}}]),
    ((CHAT,), "tools", [[], [{"type": "function", "function": {"name": "f"}}]]),
    ((CHAT,), "tool_choice", ["none", "auto", "required"]),
    ((CHAT,), "tool_choice", [{"type": "function", "function": {"name": "f"}}]),
    ((CHAT,), "parallel_tool_calls", [False]),
    ((EMBEDDINGS,), "encoding_format", ["float", "base64"]),
    ((EMBEDDINGS,), "dimensions", [256]),
    # Extra sampling parameters of vLLM and SGLang pass through unchecked.
    (BOTH, "top_k", [-1, 50, "anything"]),
    (BOTH, "repetition_penalty", [1.1]),
]


@pytest.mark.parametrize(
    ("path", "name", "value"),
    [(path, name, value) for paths, name, values in VALID for path in paths for value in values],
)
def test_valid_values_pass(path: str, name: str, value: Any) -> None:
    check_params({**BASE[path], name: value}, path)


def test_valid_messages_pass() -> None:
    messages: list[dict[str, Any]] = [
        {"role": role, "content": "x"}
        for role in ("system", "assistant", "user", "function", "tool", "developer")
    ]
    messages.append({"role": "assistant", "content": None, "tool_calls": []})
    messages.append({"role": "user", "content": [{"type": "text", "text": "x"}]})
    check_params({"model": "m", "messages": messages}, CHAT)
    check_params({**BASE[CHAT], "stream": True, "stream_options": {"include_usage": True}}, CHAT)
    check_params({**BASE[CHAT], "logprobs": True, "top_logprobs": 20}, CHAT)


#: (endpoint, parameters, param, code, message) — messages as OpenAI words them.
INVALID: list[tuple[str, dict[str, Any], str, str, str]] = [
    (
        CHAT,
        {"temperature": "abc"},
        "temperature",
        "invalid_type",
        "Invalid type for 'temperature': expected a decimal, but got a string instead.",
    ),
    (
        CHAT,
        {"temperature": True},
        "temperature",
        "invalid_type",
        "Invalid type for 'temperature': expected a decimal, but got a boolean instead.",
    ),
    (
        CHAT,
        {"temperature": 3},
        "temperature",
        "decimal_above_max_value",
        "Invalid 'temperature': decimal above maximum value. "
        "Expected a value <= 2, but got 3 instead.",
    ),
    (
        COMPLETIONS,
        {"temperature": -0.5},
        "temperature",
        "decimal_below_min_value",
        "Invalid 'temperature': decimal below minimum value. "
        "Expected a value >= 0, but got -0.5 instead.",
    ),
    (
        CHAT,
        {"top_p": 1.5},
        "top_p",
        "decimal_above_max_value",
        "Invalid 'top_p': decimal above maximum value. Expected a value <= 1, but got 1.5 instead.",
    ),
    (
        CHAT,
        {"n": 0},
        "n",
        "integer_below_min_value",
        "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.",
    ),
    (
        COMPLETIONS,
        {"n": MAX_CHOICES + 1},
        "n",
        "integer_above_max_value",
        f"Invalid 'n': integer above maximum value. Expected a value <= {MAX_CHOICES}, "
        f"but got {MAX_CHOICES + 1} instead.",
    ),
    (
        CHAT,
        {"n": 1.0},
        "n",
        "invalid_type",
        "Invalid type for 'n': expected an integer, but got a decimal number instead.",
    ),
    (
        CHAT,
        {"n": "2"},
        "n",
        "invalid_type",
        "Invalid type for 'n': expected an integer, but got a string instead.",
    ),
    (
        CHAT,
        {"max_completion_tokens": 0},
        "max_completion_tokens",
        "integer_below_min_value",
        "Invalid 'max_completion_tokens': integer below minimum value. "
        "Expected a value >= 1, but got 0 instead.",
    ),
    (
        COMPLETIONS,
        {"max_tokens": True},
        "max_tokens",
        "invalid_type",
        "Invalid type for 'max_tokens': expected an integer, but got a boolean instead.",
    ),
    (
        CHAT,
        {"stream": "yes"},
        "stream",
        "invalid_type",
        "Invalid type for 'stream': expected a boolean, but got a string instead.",
    ),
    (
        CHAT,
        {"stream": True, "stream_options": []},
        "stream_options",
        "invalid_type",
        "Invalid type for 'stream_options': expected an object, but got an array instead.",
    ),
    (
        CHAT,
        {"stream": True, "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
        "invalid_type",
        "Invalid type for 'stream_options.include_usage': expected a boolean, "
        "but got an integer instead.",
    ),
    (
        COMPLETIONS,
        {"stream_options": {"include_usage": True}},
        "stream_options",
        "invalid_value",
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    ),
    (
        CHAT,
        {"stop": ["a", "b", "c", "d", "e"]},
        "stop",
        "array_above_max_length",
        "Invalid 'stop': array too long. Expected an array with maximum length 4, "
        "but got an array with length 5 instead.",
    ),
    (
        COMPLETIONS,
        {"stop": 7},
        "stop",
        "invalid_type",
        "Invalid type for 'stop': expected one of a string or array of strings, "
        "but got an integer instead.",
    ),
    (
        CHAT,
        {"stop": ["a", 1]},
        "stop[1]",
        "invalid_type",
        "Invalid type for 'stop[1]': expected a string, but got an integer instead.",
    ),
    (
        CHAT,
        {"presence_penalty": -2.5},
        "presence_penalty",
        "decimal_below_min_value",
        "Invalid 'presence_penalty': decimal below minimum value. "
        "Expected a value >= -2, but got -2.5 instead.",
    ),
    (
        COMPLETIONS,
        {"frequency_penalty": "high"},
        "frequency_penalty",
        "invalid_type",
        "Invalid type for 'frequency_penalty': expected a decimal, but got a string instead.",
    ),
    (
        CHAT,
        {"logit_bias": []},
        "logit_bias",
        "invalid_type",
        "Invalid type for 'logit_bias': expected an object, but got an array instead.",
    ),
    (
        CHAT,
        {"logit_bias": {"x1": 1}},
        "logit_bias",
        "invalid_value",
        "Invalid key in 'logit_bias': 'x1'. You should only be submitting non-negative integers.",
    ),
    (
        COMPLETIONS,
        {"logit_bias": {"7": 101}},
        "logit_bias.7",
        "decimal_above_max_value",
        "Invalid 'logit_bias.7': decimal above maximum value. "
        "Expected a value <= 100, but got 101 instead.",
    ),
    (
        CHAT,
        {"logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}},
        "logit_bias",
        "object_above_max_properties",
        f"Invalid 'logit_bias': too many properties. Expected an object with at most "
        f"{MAX_LOGIT_BIAS} properties, but got an object with {MAX_LOGIT_BIAS + 1} "
        "properties instead.",
    ),
    (
        CHAT,
        {"logprobs": 1},
        "logprobs",
        "invalid_type",
        "Invalid type for 'logprobs': expected a boolean, but got an integer instead.",
    ),
    (
        COMPLETIONS,
        {"logprobs": 6},
        "logprobs",
        "integer_above_max_value",
        "Invalid 'logprobs': integer above maximum value. Expected a value <= 5, "
        "but got 6 instead.",
    ),
    (
        COMPLETIONS,
        {"logprobs": True},
        "logprobs",
        "invalid_type",
        "Invalid type for 'logprobs': expected an integer, but got a boolean instead.",
    ),
    (
        CHAT,
        {"logprobs": True, "top_logprobs": 21},
        "top_logprobs",
        "integer_above_max_value",
        "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, "
        "but got 21 instead.",
    ),
    (
        CHAT,
        {"top_logprobs": 2},
        "top_logprobs",
        "invalid_value",
        "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
    ),
    (
        CHAT,
        {"stream_options": {"include_usage": True}, "stream": False},
        "stream_options",
        "invalid_value",
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    ),
    (  # a pair is checked after every parameter's own check
        CHAT,
        {"stream_options": {}, "top_logprobs": 2, "temperature": 3},
        "temperature",
        "decimal_above_max_value",
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, "
        "but got 3 instead.",
    ),
    (  # stream_options' pair first
        CHAT,
        {"top_logprobs": 2, "stream_options": {}},
        "stream_options",
        "invalid_value",
        "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
    ),
    (
        CHAT,
        {"seed": 1.5},
        "seed",
        "invalid_type",
        "Invalid type for 'seed': expected an integer, but got a decimal number instead.",
    ),
    (
        CHAT,
        {"seed": 2**63},
        "seed",
        "integer_above_max_value",
        f"Invalid 'seed': integer above maximum value. Expected a value <= {2**63 - 1}, "
        f"but got {2**63} instead.",
    ),
    (
        CHAT,
        {"user": {"a": 1}},
        "user",
        "invalid_type",
        "Invalid type for 'user': expected a string, but got an object instead.",
    ),
    (
        COMPLETIONS,
        {"echo": "no"},
        "echo",
        "invalid_type",
        "Invalid type for 'echo': expected a boolean, but got a string instead.",
    ),
    (
        COMPLETIONS,
        {"best_of": 21},
        "best_of",
        "integer_above_max_value",
        "Invalid 'best_of': integer above maximum value. Expected a value <= 20, "
        "but got 21 instead.",
    ),
    (
        COMPLETIONS,
        {"suffix": 1},
        "suffix",
        "invalid_type",
        "Invalid type for 'suffix': expected a string, but got an integer instead.",
    ),
    (
        CHAT,
        {"response_format": "json"},
        "response_format",
        "invalid_type",
        "Invalid type for 'response_format': expected an object, but got a string instead.",
    ),
    (
        CHAT,
        {"response_format": {}},
        "response_format.type",
        "missing_required_parameter",
        "Missing required parameter: 'response_format.type'.",
    ),
    (
        CHAT,
        {"response_format": {"type": "bogus"}},
        "response_format.type",
        "invalid_value",
        "Invalid value: 'bogus'. Supported values are: 'json_object', 'json_schema', "
        "'structural_tag', and 'text'.",
    ),
    (
        CHAT,
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "missing_required_parameter",
        "Missing required parameter: 'response_format.json_schema'.",
    ),
    (
        CHAT,
        {"tools": "none"},
        "tools",
        "invalid_type",
        "Invalid type for 'tools': expected an array of objects, but got a string instead.",
    ),
    (
        CHAT,
        {"tools": [{"type": "function"}]},
        "tools[0].function",
        "missing_required_parameter",
        "Missing required parameter: 'tools[0].function'.",
    ),
    (
        CHAT,
        {"tools": [{"type": "function", "function": {"parameters": {}}}]},
        "tools[0].function.name",
        "missing_required_parameter",
        "Missing required parameter: 'tools[0].function.name'.",
    ),
    (
        CHAT,
        {"tool_choice": "bogus"},
        "tool_choice",
        "invalid_value",
        "Invalid value: 'bogus'. Supported values are: 'none', 'auto', and 'required'.",
    ),
    (
        CHAT,
        {"tool_choice": 7},
        "tool_choice",
        "invalid_type",
        "Invalid type for 'tool_choice': expected one of 'none', 'auto', 'required', "
        "or an object, but got an integer instead.",
    ),
    (
        CHAT,
        {"tool_choice": {"type": "function", "function": {}}},
        "tool_choice.function.name",
        "missing_required_parameter",
        "Missing required parameter: 'tool_choice.function.name'.",
    ),
    (
        CHAT,
        {"parallel_tool_calls": "yes"},
        "parallel_tool_calls",
        "invalid_type",
        "Invalid type for 'parallel_tool_calls': expected a boolean, but got a string instead.",
    ),
    (
        EMBEDDINGS,
        {"encoding_format": "int8"},
        "encoding_format",
        "invalid_value",
        "Invalid value: 'int8'. Supported values are: 'float' and 'base64'.",
    ),
    (
        EMBEDDINGS,
        {"dimensions": 0},
        "dimensions",
        "integer_below_min_value",
        "Invalid 'dimensions': integer below minimum value. Expected a value >= 1, "
        "but got 0 instead.",
    ),
    # model and messages
    (
        CHAT,
        {"model": None},
        "model",
        "missing_required_parameter",
        "Missing required parameter: 'model'.",
    ),
    (
        COMPLETIONS,
        {"model": 3},
        "model",
        "invalid_type",
        "Invalid type for 'model': expected a string, but got an integer instead.",
    ),
    (
        CHAT,
        {"model": ""},
        "model",
        "empty_string",
        "Invalid 'model': empty string. Expected a string with minimum length 1, "
        "but got an empty string instead.",
    ),
    (
        CHAT,
        {"messages": None},
        "messages",
        "missing_required_parameter",
        "Missing required parameter: 'messages'.",
    ),
    (
        CHAT,
        {"messages": "ping"},
        "messages",
        "invalid_type",
        "Invalid type for 'messages': expected an array of objects, but got a string instead.",
    ),
    (
        CHAT,
        {"messages": []},
        "messages",
        "empty_array",
        "Invalid 'messages': empty array. Expected an array with minimum length 1, "
        "but got an empty array instead.",
    ),
    (
        CHAT,
        {"messages": ["ping"]},
        "messages[0]",
        "invalid_type",
        "Invalid type for 'messages[0]': expected an object, but got a string instead.",
    ),
    (
        CHAT,
        {"messages": [{"content": "ping"}]},
        "messages[0].role",
        "missing_required_parameter",
        "Missing required parameter: 'messages[0].role'.",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "a"}, {"role": "bogus", "content": "b"}]},
        "messages[1].role",
        "invalid_value",
        "Invalid value: 'bogus'. Supported values are: 'system', 'assistant', 'user', "
        "'function', 'tool', and 'developer'.",
    ),
    (
        CHAT,
        {"messages": [{"role": ["user"], "content": "a"}]},
        "messages[0].role",
        "invalid_type",
        "Invalid type for 'messages[0].role': expected a string, but got an array instead.",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": 7}]},
        "messages[0].content",
        "invalid_type",
        "Invalid type for 'messages[0].content': expected one of a string or array of objects, "
        "but got an integer instead.",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
        "messages[0].content[0].type",
        "missing_required_parameter",
        "Missing required parameter: 'messages[0].content[0].type'.",
    ),
    (
        COMPLETIONS,
        {"prompt": None},
        "prompt",
        "missing_required_parameter",
        "Missing required parameter: 'prompt'.",
    ),
]


@pytest.mark.parametrize(
    ("path", "params", "param", "code", "message"),
    INVALID,
    ids=[f"{param}:{code}" for _, _, param, code, _ in INVALID],
)
def test_invalid_values_are_openai_400s_naming_the_parameter(
    path: str, params: dict[str, Any], param: str, code: str, message: str
) -> None:
    body = {**BASE[path], **params}
    with pytest.raises(BadRequest) as info:
        check_params(body, path)
    error = info.value.body()["error"]
    assert info.value.status == 400
    assert error == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }


def test_nan_and_infinity_are_out_of_range() -> None:
    """Python's json reads NaN and Infinity; they are no temperature."""
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(BadRequest) as info:
            check_params({**BASE[CHAT], "temperature": value}, CHAT)
        assert info.value.param == "temperature"


def test_a_long_value_is_echoed_by_its_ends_only() -> None:
    secret = "a-long-role-with-private-words-in-it"
    with pytest.raises(BadRequest) as info:
        check_params({"model": "m", "messages": [{"role": secret, "content": "x"}]}, CHAT)
    assert secret not in info.value.message
    assert info.value.message.startswith("Invalid value: 'a-l...-it'.")


def test_other_paths_are_not_checked() -> None:
    check_params({"temperature": "abc"}, "/v1/models")


#: Every parameter a rule checks, on each endpoint.
RULED = sorted((path, name) for path, rules in openai_params._RULES.items() for name in rules)


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(RULED), value=JSON)
def test_any_json_value_passes_or_is_a_400_naming_its_parameter(
    where: tuple[str, str], value: Any
) -> None:
    path, name = where
    refusal = _refusal({**BASE[path], name: value}, path)
    if refusal is not None:
        assert refusal.param is not None
        assert refusal.param.startswith(name) or refusal.param in PAIRED
        assert refusal.message


#: Parameters refused for another's value (``stream_options`` without ``stream``, …).
PAIRED = ("stream_options", "top_logprobs")


def _refusal(body: dict[str, Any], path: str) -> BadRequest | None:
    try:
        check_params(body, path)
    except BadRequest as exc:
        return exc
    return None

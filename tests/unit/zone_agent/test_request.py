from __future__ import annotations

from typing import Any

import pytest

from gtm.openai_request import parse_json_body
from gtm.tokens import count_chat_tokens, count_text_tokens, parse_chat_messages
from zone_agent.errors import BadRequest
from zone_agent.request import (
    CanaryChoice,
    Endpoint,
    Ids,
    ZoneRequest,
    canary,
    first_prompt,
    request_id,
    zone_request,
)

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_bad_json_is_a_400(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message) as info:
        parse_json_body(raw)
    assert info.value.status == 400


def _req(body: dict[str, Any], endpoint: Endpoint = Endpoint.CHAT) -> Any:
    return zone_request(body, endpoint, request_id="r")


@pytest.mark.parametrize(
    ("body", "endpoint", "param"),
    [
        ({"messages": CHAT}, Endpoint.CHAT, "model"),
        ({"model": "", "messages": CHAT}, Endpoint.CHAT, "model"),
        ({"model": 3, "messages": CHAT}, Endpoint.CHAT, "model"),
        ({"model": "m"}, Endpoint.CHAT, "messages"),
        ({"model": "m", "messages": []}, Endpoint.CHAT, "messages"),
        ({"model": "m", "messages": [{"content": "x"}]}, Endpoint.CHAT, "messages[0].role"),
        ({"model": "m", "messages": CHAT, "temperature": "abc"}, Endpoint.CHAT, "temperature"),
        ({"model": "m", "messages": CHAT, "max_tokens": 0}, Endpoint.CHAT, "max_tokens"),
        ({"model": "m", "messages": CHAT, "max_tokens": True}, Endpoint.CHAT, "max_tokens"),
        ({"model": "m", "messages": CHAT, "n": 17}, Endpoint.CHAT, "n"),
        ({"model": "m", "messages": CHAT, "stream": "yes"}, Endpoint.CHAT, "stream"),
        ({"model": "m", "prompt": []}, Endpoint.COMPLETION, "prompt"),
        ({"model": "m", "prompt": [1, "a"]}, Endpoint.COMPLETION, "prompt"),
        ({"model": "m", "prompt": {"a": 1}}, Endpoint.COMPLETION, "prompt"),
        ({"model": "m", "input": [""]}, Endpoint.EMBEDDING, "input"),
        ({"model": "m", "input": [[-1]]}, Endpoint.EMBEDDING, "input"),
    ],
)
def test_invalid_fields_name_the_parameter(
    body: dict[str, Any], endpoint: Endpoint, param: str
) -> None:
    with pytest.raises(BadRequest) as info:
        _req(body, endpoint)
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_chat_counts_tokens_as_the_worker_does() -> None:
    request = _req({"model": "m", "messages": CHAT, "max_tokens": 7, "n": 2, "stream": True})
    assert request.input_tokens == count_chat_tokens(parse_chat_messages(CHAT))
    assert request.max_output_tokens == 7
    assert request.sequences == 2
    assert request.stream is True


def test_max_completion_tokens_wins() -> None:
    body = {"model": "m", "messages": CHAT, "max_tokens": 7, "max_completion_tokens": 9}
    assert _req(body).max_output_tokens == 9


@pytest.mark.parametrize(
    ("prompt", "counts"),
    [
        ("hello world", [count_text_tokens("hello world")]),
        ([1, 2, 3], [3]),
        (["ab", "cd ef"], [count_text_tokens("ab"), count_text_tokens("cd ef")]),
        ([[1, 2], [3]], [2, 1]),
    ],
)
def test_completion_prompt_forms(prompt: Any, counts: list[int]) -> None:
    request = _req({"model": "m", "prompt": prompt, "n": 3}, Endpoint.COMPLETION)
    assert request.input_tokens == sum(counts)
    assert request.max_prompt_tokens == max(counts)
    assert request.prompts == len(counts)
    assert request.sequences == 3 * len(counts)


def test_embeddings_have_no_output_no_prefix_and_never_stream() -> None:
    request = _req({"model": "m", "input": "x " * 500, "stream": True}, Endpoint.EMBEDDING)
    assert request.max_output_tokens == 0
    assert request.prefix_hashes == ()
    assert request.stream is False


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_the_request_is_a_whole_zone_request_as_its_constructor_makes_it(
    endpoint: Endpoint,
) -> None:
    # zone_request and read_prompt make their named tuples with tuple.__new__: each
    # field given, in order, equal to the constructor's own.
    body = {"model": "m", "messages": CHAT, "prompt": ["ab", "c"], "input": "x", "n": 2}
    request = zone_request(body, endpoint, request_id="r", seq=7, version="v2")
    assert type(request) is ZoneRequest
    assert len(request) == len(ZoneRequest._fields)
    assert request == ZoneRequest(**request._asdict())
    assert (request.seq, request.version, request.canary) == (7, "v2", CanaryChoice.AUTO)


def test_growing_conversation_keeps_its_prefix_blocks() -> None:
    history = [{"role": "user", "content": "word " * 400}]
    first = _req({"model": "m", "messages": history})
    longer = _req(
        {
            "model": "m",
            "messages": [*history, {"role": "assistant", "content": "ok"}, *history],
        }
    )
    assert len(first.prefix_hashes) >= 7
    assert longer.prefix_hashes[: len(first.prefix_hashes)] == first.prefix_hashes
    assert first.tokens_per_block > 0


def test_ids_are_unique_hex_of_uuid_length() -> None:
    first, second = Ids(), Ids()
    ids = [first.new() for _ in range(1000)] + [second.new() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_the_canary_header_is_one_of_its_choices() -> None:
    assert canary({}) is CanaryChoice.AUTO
    assert canary({"x-gtm-canary": " Never "}) is CanaryChoice.NEVER
    with pytest.raises(BadRequest, match="x-gtm-canary"):
        canary({"x-gtm-canary": "sometimes"})


def test_a_sane_client_request_id_is_echoed_else_a_new_one() -> None:
    ids = Ids()
    assert request_id({"x-request-id": "client-7"}, ids) == "client-7"
    assert len(request_id({"x-request-id": "bad\x00id"}, ids)) == 32


@pytest.mark.parametrize(
    ("prompt", "first"),
    [
        ("hi", "hi"),
        ([1, 2], (1, 2)),
        (["a", "b"], "a"),
        ([[3, 4], [5]], (3, 4)),
        ([], ()),
        (None, None),
        (7, None),
        ([{"x": 1}], None),
    ],
)
def test_the_first_prompt_is_text_or_token_ids(prompt: object, first: object) -> None:
    assert first_prompt(prompt) == first

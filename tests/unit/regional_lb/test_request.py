from __future__ import annotations

import json

import pytest

from gtm.models import Priority
from gtm.openai_request import parse_json_body
from gtm.tokens import count_chat_tokens, count_text_tokens, parse_chat_messages
from regional_lb import request as req
from regional_lb.errors import BadRequest
from zone_agent.prefix import text_block_hashes as zone_agent_hashes

LONG = "You are a helpful assistant. " * 100


def test_prefix_hashes_match_the_zone_agents() -> None:
    facts = req.body_facts({"model": "m", "prompt": LONG}, req.Endpoint.COMPLETION)
    assert len(facts.prefix_hashes) == min(req.HASHED_BLOCKS, len(LONG.encode()) // 256)
    assert facts.prefix_hashes == zone_agent_hashes(LONG.encode())[: req.HASHED_BLOCKS]
    short = req.body_facts({"model": "m", "prompt": "short"}, req.Endpoint.COMPLETION)
    assert short.prefix_hashes == ()


def test_chat_facts() -> None:
    messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": messages, "max_tokens": 20, "n": 2, "stream": True}
    facts = req.body_facts(body, req.Endpoint.CHAT)
    assert facts.model == "m"
    assert facts.input_tokens == count_chat_tokens(parse_chat_messages(messages))
    assert facts.max_output_tokens == 40
    assert facts.stream
    text = "".join(f"{m['role']}\n\n{m['content']}\n" for m in messages).encode()
    assert facts.prefix_hashes == zone_agent_hashes(text)[: req.HASHED_BLOCKS]
    assert facts.tokens_per_block == pytest.approx(facts.input_tokens * 256 / len(text))


def test_completion_and_embedding_facts() -> None:
    completion = req.body_facts(
        {"model": "m", "prompt": ["abc def", [1, 2, 3]]}, req.Endpoint.COMPLETION
    )
    assert completion.input_tokens == count_text_tokens("abc def") + 3
    assert completion.max_output_tokens is None
    tokens = req.body_facts({"model": "m", "prompt": [5, 6, 7, 8]}, req.Endpoint.COMPLETION)
    assert tokens.input_tokens == 4
    embedding = req.body_facts(
        {"model": "m", "input": "hello", "stream": True}, req.Endpoint.EMBEDDING
    )
    assert embedding.max_output_tokens == 0
    assert not embedding.stream
    assert embedding.prefix_hashes == ()


@pytest.mark.parametrize(
    ("raw", "endpoint", "param"),
    [
        (b"[1]", req.Endpoint.CHAT, None),
        (b"{", req.Endpoint.CHAT, None),
        (b"[" * 100_000, req.Endpoint.CHAT, None),
        (json.dumps({"messages": []}).encode(), req.Endpoint.CHAT, "model"),
        (json.dumps({"model": "m", "messages": []}).encode(), req.Endpoint.CHAT, "messages"),
        (json.dumps({"model": "m", "prompt": {}}).encode(), req.Endpoint.COMPLETION, "prompt"),
        (
            json.dumps({"model": "m", "prompt": ["a", 1]}).encode(),
            req.Endpoint.COMPLETION,
            "prompt",
        ),
        (
            json.dumps({"model": "m", "prompt": "a", "max_tokens": 0}).encode(),
            req.Endpoint.COMPLETION,
            "max_tokens",
        ),
        (
            json.dumps({"model": "m", "prompt": "a", "max_tokens": True}).encode(),
            req.Endpoint.COMPLETION,
            "max_tokens",
        ),
        (json.dumps({"model": "m", "prompt": "a", "n": 99}).encode(), req.Endpoint.COMPLETION, "n"),
        (
            json.dumps({"model": "m", "prompt": "a", "temperature": "abc"}).encode(),
            req.Endpoint.COMPLETION,
            "temperature",
        ),
        (
            json.dumps({"model": "m", "prompt": "a", "stream": "yes"}).encode(),
            req.Endpoint.COMPLETION,
            "stream",
        ),
        (
            json.dumps({"model": "m", "input": [""] * 3000}).encode(),
            req.Endpoint.EMBEDDING,
            "input",
        ),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(
    raw: bytes, endpoint: req.Endpoint, param: str | None
) -> None:
    with pytest.raises(BadRequest) as caught:
        req.body_facts(parse_json_body(raw), endpoint)
    assert caught.value.status == 400
    assert caught.value.param == param


def test_headers() -> None:
    assert req.hop_info({}) == req.HopInfo(0, ())
    assert req.hop_info({"x-gtm-hops": "2", "x-gtm-spilled-from": "a, b"}) == req.HopInfo(
        2, ("a", "b")
    )
    for bad in ({"x-gtm-hops": "-1"}, {"x-gtm-hops": "9999"}, {"x-gtm-spilled-from": "A B"}):
        with pytest.raises(BadRequest):
            req.hop_info(bad)
    assert req.client_country({"x-gtm-client-country": "de"}) == "DE"
    assert req.client_country({}) is None
    with pytest.raises(BadRequest):
        req.client_country({"x-gtm-client-country": "DEU"})
    assert req.data_class({}) == "default"
    with pytest.raises(BadRequest):
        req.data_class({"x-gtm-data-class": "Not An Id"})
    assert req.request_id({"x-request-id": "abc"}) == "abc"
    assert len(req.request_id({"x-request-id": "x" * 500})) == 32


def test_priority_can_only_be_lowered() -> None:
    assert req.priority({}, Priority.BATCH) is Priority.BATCH
    assert req.priority({"x-gtm-priority": "best-effort"}, Priority.BATCH) is Priority.BEST_EFFORT
    assert req.priority({"x-gtm-priority": "interactive"}, Priority.BATCH) is Priority.BATCH
    with pytest.raises(BadRequest):
        req.priority({"x-gtm-priority": "urgent"}, Priority.BATCH)

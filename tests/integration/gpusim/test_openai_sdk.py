"""The emulated worker through the real OpenAI Python SDK, over real HTTP on loopback."""

from __future__ import annotations

import math
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gpusim.textgen import Completion
from gtm.gpu_profiles import BGE_LARGE, LLAMA_8B
from gtm.tokens import count_chat_tokens, count_text_tokens, encode_chat, parse_chat_messages

from .conftest import Sim, SimFactory, value

pytestmark = pytest.mark.integration

QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a helpful assistant who answers in full sentences."},
    {"role": "user", "content": "Explain how a prefix cache lets a GPU skip recomputation."},
]
IGNORE_EOS = {"ignore_eos": True}


async def test_models_are_listed(sim: Sim) -> None:
    models = await sim.client.models.list()
    assert [m.id for m in models.data] == [LLAMA_8B, BGE_LARGE]
    assert all(m.owned_by == "gtm-gpu-sim" for m in models.data)


async def test_chat_completion_fills_usage_and_text(sim: Sim) -> None:
    response = await sim.client.chat.completions.create(
        model=LLAMA_8B,
        messages=QUESTION,
        max_tokens=20,
        extra_body=IGNORE_EOS,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content is not None
    assert count_text_tokens(choice.message.content) == 20
    assert response.usage is not None
    assert response.usage.completion_tokens == 20
    assert response.usage.prompt_tokens == count_chat_tokens(parse_chat_messages(QUESTION))
    assert response.usage.total_tokens == response.usage.prompt_tokens + 20
    assert response.id.startswith("chatcmpl-")


async def test_chat_stops_at_its_natural_length_deterministically(sim: Sim) -> None:
    response = await sim.client.chat.completions.create(
        model=LLAMA_8B,
        messages=QUESTION,
    )
    expected = Completion(1, encode_chat(parse_chat_messages(QUESTION)))
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None
    assert response.usage.completion_tokens == expected.natural_length
    assert response.choices[0].message.content == expected.take(expected.natural_length)
    again = await sim.client.chat.completions.create(
        model=LLAMA_8B,
        messages=QUESTION,
    )
    assert again.choices[0].message.content == response.choices[0].message.content
    # The second request found the prompt's full blocks in the prefix cache.
    assert again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 16 * (again.usage.prompt_tokens // 16)


async def test_chat_streaming_with_usage(sim: Sim) -> None:
    stream = await sim.client.chat.completions.create(
        model=LLAMA_8B,
        messages=QUESTION,
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    content: list[str] = []
    finish: list[str] = []
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert len(content) == 30  # one SSE chunk per token, none buffered together
    assert count_text_tokens("".join(content)) == 30
    assert finish == ["length"]
    assert usage is not None
    assert usage.completion_tokens == 30


async def test_completions_streaming_and_batched_prompts(sim: Sim) -> None:
    batch = await sim.client.completions.create(
        model=LLAMA_8B,
        prompt=["first prompt", "second prompt"],
        max_tokens=5,
        extra_body=IGNORE_EOS,
    )
    assert [c.index for c in batch.choices] == [0, 1]
    assert all(count_text_tokens(c.text) == 5 for c in batch.choices)
    assert batch.usage is not None
    assert batch.usage.prompt_tokens == count_text_tokens("first prompt") + count_text_tokens(
        "second prompt"
    )
    assert batch.usage.completion_tokens == 10

    stream = await sim.client.completions.create(
        model=LLAMA_8B, prompt=[1, 2, 3, 4], max_tokens=8, stream=True, n=2, extra_body=IGNORE_EOS
    )
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert all(count_text_tokens(t) == 8 for t in texts.values())
    assert texts[0] != texts[1]  # choices are seeded apart


async def test_embeddings_in_float_and_base64(sim: Sim) -> None:
    default = await sim.client.embeddings.create(model=BGE_LARGE, input=["a cat", "a dog"])
    assert [d.index for d in default.data] == [0, 1]
    assert len(default.data[0].embedding) == 1024
    assert default.usage.prompt_tokens == 4
    floats = await sim.client.embeddings.create(
        model=BGE_LARGE, input="a cat", encoding_format="float", dimensions=64
    )
    assert len(floats.data[0].embedding) == 64
    # Shortened embeddings are the full one truncated and re-normalised (as OpenAI's are).
    head = default.data[0].embedding[:64]
    norm = math.sqrt(sum(v * v for v in head))
    assert floats.data[0].embedding == pytest.approx([v / norm for v in head], abs=1e-6)


async def test_errors_map_to_the_sdk_exception_classes(sim: Sim) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await sim.client.chat.completions.create(model="no/such-model", messages=QUESTION)
    assert missing.value.status_code == 404
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        await sim.client.chat.completions.create(
            model=LLAMA_8B,
            messages=QUESTION,
            max_tokens=200_000,
        )
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="does not support completions"):
        await sim.client.chat.completions.create(model=BGE_LARGE, messages=QUESTION)
    with pytest.raises(openai.BadRequestError, match="does not support embeddings"):
        await sim.client.embeddings.create(model=LLAMA_8B, input="x")
    with pytest.raises(openai.BadRequestError, match="maximum context length is 512"):
        await sim.client.embeddings.create(model=BGE_LARGE, input="word " * 600)
    with pytest.raises(openai.BadRequestError, match="messages"):
        await sim.client.chat.completions.create(
            model=LLAMA_8B,
            messages=cast(Any, [{"role": "user", "content": [{"type": "audio"}]}]),
        )


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"model": 5, "messages": []}', "model"),
        (b'{"model": "m", "messages": "hello"}', "messages"),
        ("\udcff".encode("utf-8", "surrogatepass"), "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 99}', "n"),
    ],
)
async def test_malformed_bodies_get_400_in_openai_shape(sim: Sim, body: bytes, needle: str) -> None:
    response = await sim.http.post(sim.url + "/v1/chat/completions", content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"]


async def test_unknown_paths_and_methods_are_json_errors(sim: Sim) -> None:
    missing = await sim.http.get(sim.url + "/v2/nothing")
    assert missing.status_code == 404
    assert "error" in missing.json()
    wrong = await sim.http.get(sim.url + "/v1/chat/completions")
    assert wrong.status_code == 405
    # The same shape as every tier's (gtm.openai_errors.error_middleware).
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong.headers["Allow"]


async def test_full_queue_is_a_rate_limit(make_sim: SimFactory) -> None:
    sim = await make_sim(max_queue=0)
    with pytest.raises(openai.RateLimitError) as info:
        await sim.client.chat.completions.create(model=LLAMA_8B, messages=QUESTION)
    assert info.value.code == "queue_full"


async def test_metrics_move_with_traffic(sim: Sim) -> None:
    before = await sim.scrape()
    for _ in range(2):
        await sim.client.chat.completions.create(
            model=LLAMA_8B,
            messages=QUESTION,
            max_tokens=10,
            extra_body=IGNORE_EOS,
        )
    after = await sim.scrape()
    m = {"model_name": LLAMA_8B}
    prompt = count_chat_tokens(parse_chat_messages(QUESTION))
    assert (
        value(after, "vllm:generation_tokens_total", **m)
        - value(before, "vllm:generation_tokens_total", **m)
        == 20
    )
    assert value(after, "vllm:prefix_cache_queries_total", **m) == 2 * prompt
    assert value(after, "vllm:prefix_cache_hits_total", **m) == 16 * (prompt // 16)
    assert value(after, "vllm:time_to_first_token_seconds_count", **m) == 2
    assert value(after, "vllm:inter_token_latency_seconds_count", **m) == 18
    assert value(after, "vllm:e2e_request_latency_seconds_count", **m) == 2
    assert value(after, "vllm:request_success_total", finished_reason="length", **m) == 2
    info = {
        "model_name": LLAMA_8B,
        "block_size": "16",
        "num_gpu_blocks": str(sim.server.driver(LLAMA_8B).engine.profile.num_gpu_blocks),
        "enable_prefix_caching": "True",
    }
    assert value(after, "vllm:cache_config_info", **info) == 1.0
    assert (
        value(
            after, "gtm_gpusim_http_requests_total", endpoint="/v1/chat/completions", status="200"
        )
        == 2
    )


async def test_running_and_kv_gauges_while_a_stream_is_open(sim: Sim) -> None:
    stream = await sim.client.chat.completions.create(
        model=LLAMA_8B,
        messages=QUESTION,
        max_tokens=100_000,
        stream=True,
        extra_body=IGNORE_EOS,
    )
    async for _ in stream:
        break  # the first token is here: the request is in the running batch
    during = await sim.scrape()
    await stream.close()
    m = {"model_name": LLAMA_8B}
    assert value(during, "vllm:num_requests_running", **m) == 1
    assert value(during, "vllm:num_requests_waiting", **m) == 0
    assert value(during, "vllm:kv_cache_usage_perc", **m) > 0


async def test_sglang_flavor(make_sim: SimFactory) -> None:
    sim = await make_sim(metrics_flavor="sglang")
    await sim.client.chat.completions.create(
        model=LLAMA_8B,
        messages=QUESTION,
        max_tokens=3,
        extra_body=IGNORE_EOS,
    )
    samples = await sim.scrape()
    names = {name for name, _ in samples}
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"} <= names
    assert "vllm:num_requests_running" not in names
    assert value(samples, "sglang:generation_tokens_total", model_name=LLAMA_8B) == 3


async def test_health(sim: Sim) -> None:
    response = await sim.http.get(sim.url + "/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"

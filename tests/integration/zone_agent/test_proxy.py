"""The agent as an OpenAI endpoint: real emulated workers, the real openai SDK."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gtm.gpu_profiles import BGE_LARGE, LLAMA_8B

from .conftest import ZoneFactory

pytestmark = pytest.mark.integration

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello, please."}]


async def test_chat_through_the_agent(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "A100-80GB"])
    raw = await zone.client.chat.completions.with_raw_response.create(
        model=LLAMA_8B, messages=HELLO, max_tokens=5, extra_headers={"x-request-id": "req-42"}
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 5
    assert raw.headers["x-gtm-zone"] == "zone-a"
    assert raw.headers["x-gtm-gpu"] in zone.ids
    assert len(raw.headers["x-gtm-decision-id"]) == 32
    assert raw.headers["x-request-id"] == "req-42"
    await zone.no_leaks()


async def test_streaming_passes_through(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100"])
    stream = await zone.client.chat.completions.create(
        model=LLAMA_8B,
        messages=HELLO,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces = [
        c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) == 20
    await zone.no_leaks()
    assert zone.served_by("gpu-0") == 1


async def test_completions_and_embeddings(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["L40S"])
    completion = await zone.client.completions.create(
        model=LLAMA_8B, prompt="Once upon", max_tokens=4
    )
    assert completion.choices[0].text
    embedding = await zone.client.embeddings.create(model=BGE_LARGE, input=["a", "b"])
    assert len(embedding.data) == 2
    assert len(embedding.data[0].embedding) == 1024
    await zone.no_leaks()


async def test_models_health_ready_and_metrics(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "A100-80GB"])
    models = await zone.client.models.list()
    assert {m.id for m in models.data} == {LLAMA_8B, BGE_LARGE}
    async with zone.http.get(zone.url + "/healthz") as response:
        assert response.status == 200
    async with zone.http.get(zone.url + "/readyz") as response:
        assert response.status == 200
        assert (await response.json())["available_gpus"] == 2
    await zone.client.chat.completions.create(model=LLAMA_8B, messages=HELLO, max_tokens=2)
    async with zone.http.get(zone.url + "/metrics") as response:
        text = await response.text()
    assert "gtm_zone_assignments_total" in text
    assert (
        'gtm_routing_plugin_duration_seconds_count{extension_point="scorer",plugin="zone-ttft",tier="zone"}'
        in text
    )
    assert 'gtm_zone_scrape_age_seconds{gpu="gpu-0"}' in text
    assert 'gtm_zone_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in text


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (
            b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model_not_found",
        ),
        (b'{"model": "' + LLAMA_8B.encode() + b'", "messages": []}', 400, "empty_array"),
    ],
)
async def test_bad_input_gets_openai_errors(
    make_zone: ZoneFactory, body: bytes, status: int, code: str
) -> None:
    zone = await make_zone(["H100"])
    async with zone.http.post(zone.url + "/v1/chat/completions", data=body) as response:
        assert response.status == status
        error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code


async def test_prompt_too_long_for_every_gpu_names_the_limit(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100"], sim_overrides={"num_gpu_blocks": 64})
    with pytest.raises(openai.BadRequestError) as info:
        await zone.client.chat.completions.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "word " * 2000}], max_tokens=4
        )
    assert "maximum context length is 1024 tokens" in str(info.value)
    assert info.value.code == "context_length_exceeded"


async def test_no_healthy_gpu_is_a_503_with_retry_after(make_zone: ZoneFactory) -> None:
    zone = await make_zone([], extra_workers=["http://127.0.0.1:9,gpu=H100,model=" + LLAMA_8B])
    async with zone.http.post(
        zone.url + "/v1/chat/completions", json={"model": LLAMA_8B, "messages": HELLO}
    ) as response:
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        assert (await response.json())["error"]["type"] == "service_unavailable"
    async with zone.http.get(zone.url + "/readyz") as response:
        assert response.status == 503


async def test_unknown_route_and_method(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100"])
    async with zone.http.get(zone.url + "/v1/nothing") as response:
        assert response.status == 404
        assert "error" in await response.json()
    async with zone.http.get(zone.url + "/v1/chat/completions") as response:
        assert response.status == 405


async def test_concurrent_load_spreads_over_gpus(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "H100", "A100-80GB"])

    async def one(i: int) -> str:
        raw = await zone.client.chat.completions.with_raw_response.create(
            model=LLAMA_8B,
            messages=[{"role": "user", "content": f"request {i} " + "filler " * 300}],
            max_tokens=50,
            extra_body={"ignore_eos": True},
        )
        return raw.headers["x-gtm-gpu"]

    used = await asyncio.gather(*(one(i) for i in range(12)))
    assert set(used) == set(zone.ids)
    await zone.no_leaks()


async def test_a_repeated_prefix_sticks_to_its_gpu(make_zone: ZoneFactory) -> None:
    zone = await make_zone(["H100", "H100", "H100"])
    system = "You are a helpful assistant with a very long system prompt. " * 200
    gpus = []
    for i in range(4):
        raw = await zone.client.chat.completions.with_raw_response.create(
            model=LLAMA_8B,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}],
            max_tokens=2,
        )
        gpus.append(raw.headers["x-gtm-gpu"])
    assert len(set(gpus)) == 1
    async with aiohttp.ClientSession() as http, http.get(zone.sim(gpus[0]).url + "/metrics") as r:
        text = await r.text()
    hits = next(
        line for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total")
    )
    assert float(hits.split()[-1]) > 0  # the worker's cache really was hit

"""An operator runs ``gtm zone`` with its lean server for the OpenAI endpoints (the
default, ``--http-server lean``) or aiohttp's (``--http-server aiohttp``): a tenant's SDK
gets the same answers either way, on kept-alive connections that also ask for other
paths, and the zone's /metrics shows each connection the lean server handed to aiohttp.

Real processes on loopback: one ``gtm gpu-sim`` worker and ``gtm zone`` in front of it,
driven by the OpenAI SDK (one connection pool) and a plain HTTP client.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.users_paths.direct_clients import zone_before_one_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello, please."}]


async def _fallbacks(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gtm_http_fallbacks_total"
    }


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
async def test_the_sdk_gets_the_same_answers_from_either_server(
    server: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        zone = await stack.enter_async_context(
            zone_before_one_worker(server, tmp_path / "zone.log", MODEL)
        )
        # One connection for everything the SDK asks, so the hot path and the others
        # share it.
        pool = httpx.AsyncClient(limits=httpx.Limits(max_connections=1))
        client = openai.AsyncOpenAI(
            base_url=zone.url + "/v1", api_key="k", max_retries=0, http_client=pool
        )
        stack.push_async_callback(client.close)
        http = await stack.enter_async_context(aiohttp.ClientSession())

        for turn in range(3):
            chat = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=HELLO, max_tokens=4
            )
            assert chat.headers["x-gtm-gpu"] == "gpu-a"
            assert chat.parse().choices[0].message.content
            stream = await client.chat.completions.create(
                model=MODEL, messages=HELLO, max_tokens=4, stream=True
            )
            pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            assert "".join(pieces)
            with pytest.raises(openai.NotFoundError) as refused:
                await client.chat.completions.create(
                    model="no-such-model",
                    messages=HELLO,
                )
            assert refused.value.code == "model_not_found"
            if turn == 1:
                # Another path on the same connection: aiohttp's from then on.
                models = await client.models.list()
                assert [m.id for m in models.data] == [MODEL]

        fallbacks = await _fallbacks(http, zone.url)
    if server == "lean":
        assert fallbacks["route"] == 2  # the SDK's connection, this scrape's
        assert sum(fallbacks.values()) == 2
    else:
        assert fallbacks == {}

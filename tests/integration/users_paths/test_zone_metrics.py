"""An operator scrapes a busy ``gtm zone``'s /metrics: every request a tenant sent is
counted once in each per-request counter and histogram (the lock-free ones of
gtm.fastmetrics, in prometheus_client's exposition, ``_created`` series included), and
the per-plugin decision latency is sampled on the first decision and then one in 256
(``plugin_timing_every``'s default), so it stays out of the zone's decision cost.

Real processes on loopback: one ``gtm gpu-sim`` worker and ``gtm zone`` in front of it,
driven by the OpenAI SDK; /metrics read with prometheus_client's parser.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.integration.users_paths.direct_clients import zone_before_one_worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello, please."}]
#: More than two of the old one-in-16 plugin samples, fewer than the new one in 256.
REQUESTS = 40


async def _scrape(url: str) -> list[Sample]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _total(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
async def test_each_request_is_counted_once_and_plugins_are_timed_on_a_sample(
    server: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        zone = await stack.enter_async_context(
            zone_before_one_worker(server, tmp_path / "zone.log", MODEL)
        )
        client = openai.AsyncOpenAI(base_url=zone.url + "/v1", api_key="k", max_retries=0)
        stack.push_async_callback(client.close)
        for _ in range(REQUESTS):
            chat = await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
            assert chat.choices[0].message.content
        samples = await _scrape(zone.url)

    chat_200 = {"endpoint": "/v1/chat/completions", "status": "200"}
    assert _total(samples, "gtm_zone_requests_total", **chat_200) == REQUESTS
    assert _total(samples, "gtm_zone_requests_created", **chat_200) > 0
    assert _total(samples, "gtm_zone_assignments_total") == REQUESTS
    for family, labels in (
        ("gtm_zone_request_overhead_seconds", {}),
        ("gtm_zone_first_byte_seconds", {"model": MODEL}),
        ("gtm_routing_decision_duration_seconds", {"tier": "zone"}),
    ):
        assert _total(samples, family + "_count", **labels) == REQUESTS, family
        assert _total(samples, family + "_bucket", le="+Inf", **labels) == REQUESTS, family
        assert _total(samples, family + "_sum", **labels) > 0, family
        assert _total(samples, family + "_created", **labels) > 0, family
        cumulative = [s.value for s in samples if s.name == family + "_bucket"]
        assert cumulative == sorted(cumulative), family
    plugins = [s for s in samples if s.name == "gtm_routing_plugin_duration_seconds_count"]
    assert plugins
    # The first decision, and none of the next 39 (one in 16 would have timed two more).
    assert {s.value for s in plugins} == {1.0}

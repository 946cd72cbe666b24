"""A stream that breaks after its first byte reaches the client as OpenAI's error event,
and is counted once, by the tier whose hop broke (``gtm_stream_breaks_total``).

The user's path of issue 25: ``gtm up --processes``, a GPU worker cuts its streams (the
emulator's ``stop_stream_after`` fault: the connection closed mid-stream, no
``[DONE]``). The client talks to the front door with the OpenAI SDK and with a plain
HTTP client. Before, the zone, the regional LB and the front door each reset their
client's connection and each logged a warning: the SDK saw a transport error with no
OpenAI error in it, and nothing counted the break.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gtmctl.up.helpers import Up, running_up
from tests.integration.users_paths.direct_clients import (
    BERLIN,
    MODEL,
    TENANT_KEY,
    deployment,
    region_url,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Tokens a worker sends before it cuts the stream.
CUT_AFTER = 3
REGION = "eu-west"


async def set_faults(document: dict[str, Any], faults: dict[str, Any] | None) -> None:
    """Every GPU worker's faults (``None``: cleared), through its admin API."""
    async with aiohttp.ClientSession() as session:
        for gpu in document["gpus"]:
            assert gpu["url"], gpu
            url = gpu["url"].rstrip("/") + "/admin/faults"
            method = "POST" if faults is not None else "DELETE"
            async with session.request(method, url, json=faults) as response:
                assert response.status == 200, await response.text()


async def breaks(url: str) -> dict[tuple[str, str], float]:
    """``gtm_stream_breaks_total`` at ``url``'s /metrics, by (tier, cause)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        text = await response.text()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gtm_stream_breaks_total":
                found[(sample.labels["tier"], sample.labels["cause"])] = sample.value
    return found


async def drain(stream: openai.AsyncStream[Any], received: list[str]) -> None:
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(chunk.choices[0].delta.content)


async def every_tier(up: Up, document: dict[str, Any]) -> dict[str, dict[tuple[str, str], float]]:
    urls = {"global": up.base_url, "regional": region_url(document, REGION)}
    urls |= {f"zone {z['name']}": z["url"] for z in document["zones"]}
    return {name: await breaks(url) for name, url in urls.items()}


async def test_a_stream_cut_by_its_gpu_reaches_the_client_as_an_error_event_counted_once(
    tmp_path: Path,
) -> None:
    async with running_up(tmp_path, "--processes", "--speedup", "10", regions=(REGION,)) as up:
        document = await deployment(up)
        await set_faults(document, {"stop_stream_after": CUT_AFTER})

        # The OpenAI SDK raises the error event as an APIError, after the tokens sent.
        client = openai.AsyncOpenAI(
            base_url=up.base_url + "/v1",
            api_key=TENANT_KEY,
            default_headers={"X-Forwarded-For": BERLIN},
            max_retries=0,
        )
        received: list[str] = []
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=50,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        with pytest.raises(openai.APIError) as raised:
            await drain(stream, received)
        await client.close()
        assert 0 < len(received) <= CUT_AFTER
        error = raised.value.body
        assert isinstance(error, dict)
        assert error["code"] == "upstream_reset"
        assert error["type"] == "server_error"

        # A plain HTTP client: an error event in OpenAI's shape, no [DONE].
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 50,
            "stream": True,
            "ignore_eos": True,
        }
        headers = {"Authorization": f"Bearer {TENANT_KEY}", "X-Forwarded-For": BERLIN}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                up.base_url + "/v1/chat/completions", json=body, headers=headers
            ) as response,
        ):
            assert response.status == 200
            raw = await response.read()
        events = [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]
        assert b"[DONE]" not in events
        last = json.loads(events[-1])
        assert set(last["error"]) == {"message", "type", "param", "code"}
        assert last["error"]["code"] == "upstream_reset"

        # Counted once, where the hop broke (zone → GPU); the tiers above relayed the
        # event and saw their stream end cleanly.
        counts = await every_tier(up, document)
        zone_resets = sum(
            c.get(("zone", "upstream_reset"), 0.0)
            for n, c in counts.items()
            if n.startswith("zone")
        )
        assert zone_resets == 2, counts
        assert counts["regional"][("regional", "upstream_reset")] == 0, counts
        assert counts["global"][("global", "upstream_reset")] == 0, counts
        await set_faults(document, None)

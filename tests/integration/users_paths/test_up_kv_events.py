"""A user of the demo tries KV events: ``gtm up --processes --kv-events``.

One region of the example topology on private loopback addresses: every emulated GPU
publishes vLLM's KV events on sockets of its own and registers them, and every zone
agent reads them. The client sends a few chat requests through the front door and then
reads, from the zones' own ``/metrics``, that the zones applied events the GPUs
published (``gtm_zone_kv_events_applied_total``), none of them undecodable.

Before, ``gtm up`` had no way to turn KV events on: the option did not exist, and the
zones only guessed each GPU's cache from what they had sent where.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gtmctl.up.helpers import running_up
from tests.integration.users_paths.direct_clients import (
    MODEL,
    admin_document,
    tenant_client,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Longest start of the whole deployment (a shared 2-core machine under load).
START_TIMEOUT_S = 150.0
#: Longest wait for a zone to apply the events of the requests sent.
EVENTS_WITHIN_S = 30.0
#: Several KV blocks of 16 tokens, so each request stores full blocks.
PROMPT = " ".join(f"word{i}" for i in range(200))


async def kv_event_samples(session: aiohttp.ClientSession, zone_url: str) -> dict[str, float]:
    """Sample name → sum over its GPUs, of a zone's ``gtm_zone_kv_event*`` series."""
    async with session.get(zone_url + "/metrics") as response:
        text = await response.text()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("gtm_zone_kv_event"):
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


async def test_the_zones_apply_the_gpus_kv_events(tmp_path: Path) -> None:
    async with running_up(
        tmp_path,
        *("--processes", "--speedup", "20", "--kv-events"),
        regions=("eu-west",),
        start_timeout_s=START_TIMEOUT_S,
    ) as up:
        async with tenant_client(up) as client:
            for turn in range(3):
                answer = await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"{turn} {PROMPT}"}],
                    max_tokens=4,
                )
                assert answer.choices[0].message.content
        document = await admin_document(up, "fleet")
        zones = [z["url"] for r in document["regions"] for z in r["zones"]]
        assert zones
        deadline = time.monotonic() + EVENTS_WITHIN_S
        async with aiohttp.ClientSession() as session:
            while True:
                seen = [await kv_event_samples(session, url) for url in zones]
                applied = sum(s.get("gtm_zone_kv_events_applied_total", 0.0) for s in seen)
                if applied > 0 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.25)
    assert applied > 0, seen
    assert sum(s.get("gtm_zone_kv_event_decode_errors_total", 0.0) for s in seen) == 0, seen

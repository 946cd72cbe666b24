"""Long prompts stay on their continent when their region's fast GPUs idle (issue 22,
item 2).

``gtm up --processes`` with the example topology's us-east and eu-west, idle. Each has
an H100 for Llama-3.1-8B; eu-west's other GPUs (L4, A100, L40S) are slower than
us-east's (L4, H100, L40S), so eu-west's *average* GPU is the slower one. A client in
London (its address in ``X-Forwarded-For`` from 127.0.0.1, the local deployment's
trusted proxy, as ``gtm load`` sends it) sends a prompt of about 12,000 tokens through
the front door: it is served in eu-west, on the idle H100 there, and the decision API
prices it so. The test first waits for every GPU to leave its slow start (the zone
agents ramp a new GPU's weight over 30 s, so rates differ between regions until then),
reading the region summaries from the deployment's store.

Before, the global tier priced each region by its average GPU: the prompt looked
~0.2 s faster to prefill in us-east than in eu-west, more than the ~80 ms of ocean
between them, and crossed the Atlantic while eu-west's H100 idled.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gtm.clock import SystemClock
from gtm.gpu_profiles import get_profile
from gtm.metrics import new_registry
from gtm.models import RegionSummary
from gtm.state import keys
from gtm.state.url import open_store
from tests.integration.gtmctl.up.helpers import Up, running_up
from tests.integration.gtmctl.up.test_up import eventually
from tests.integration.users_paths.direct_clients import (
    MODEL,
    TENANT_KEY,
    TRUSTED_SOURCE,
    city_client,
    deployment,
)

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(300)]

LONDON = city_client("London", "GB")
#: One token per word (gtm.tokens: a short word with its leading space is one piece).
WORDS = 12_000
PROMPT = "".join(f" w{i % 1000}" for i in range(WORDS))
#: A decision priced without a region's summary costs its RTT alone (< 200 ms from
#: London to either region); with summaries, the prompt's prefill comes on top.
PRICED_MS = 200.0


async def post(up: Up, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    """``body`` to the front door from the trusted proxy, for a London client."""
    headers = {"Authorization": f"Bearer {TENANT_KEY}", "X-Forwarded-For": LONDON}
    connector = aiohttp.TCPConnector(local_addr=(TRUSTED_SOURCE, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(up.base_url + path, json=body, headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.json()


#: The zone agents' slow start (zone_agent.health) and a few publications, with room.
WARM_UP_S = 90.0


async def warmed_up(up: Up, state: str, regions: tuple[str, ...]) -> None:
    """Until each region's summary has its GPUs' full prefill rate for MODEL (no GPU is
    in slow start any more), as the deployment's store holds it."""
    expected = {
        r.id: math.fsum(
            get_profile(g.type, MODEL).prefill_tokens_per_s
            for z in r.zones
            for g in z.gpus
            for _ in range(g.count)
            if MODEL in g.models
        )
        for r in up.topology.regions
    }
    store = open_store(state, clock=SystemClock(), registry=new_registry())
    deadline = time.monotonic() + WARM_UP_S
    try:
        while True:
            rates = {}
            for region in regions:
                found = await store.get(keys.region_summary(region))
                load = None if found is None else RegionSummary.model_validate_json(found.value)
                model = None if load is None else load.load_for(MODEL)
                rates[region] = 0.0 if model is None else model.prefill_tokens_per_s
            if all(rates[r] >= 0.99 * expected[r] for r in regions):
                return
            assert time.monotonic() < deadline, f"not warmed up: {rates} of {expected}"
            await asyncio.sleep(0.5)
    finally:
        await store.aclose()


async def route(up: Up) -> dict[str, Any]:
    """The front door's decision for the London client's long prompt (POST /v1/route)."""
    status, _, outcome = await post(up, "/v1/route", {"model": MODEL, "input_tokens": WORDS})
    assert status == 200, outcome
    found: dict[str, Any] = outcome
    return found


async def test_a_long_prompt_from_london_is_served_in_the_idle_eu(tmp_path: Path) -> None:
    regions = ("us-east", "eu-west")
    async with running_up(tmp_path, "--processes", "--speedup", "20", regions=regions) as up:
        await warmed_up(up, (await deployment(up))["state"], regions)

        async def both_regions_priced() -> bool:
            predicted = (await route(up)).get("predicted_ttft_ms")
            return predicted is not None and predicted > PRICED_MS

        # Both regions' summaries reached the global tier (an unpriced one costs its RTT
        # alone and would win). Its view may be a publication behind the store: a few
        # percent of an H100's rate, tens of ms on this prompt, against ~80 ms of RTT.
        await eventually(both_regions_priced, "the front door prices both regions")
        decision = await route(up)
        assert decision["region"] == "eu-west", decision
        # Priced on eu-west's idle H100: the RTT and the prompt at one H100's rate.
        h100_ms = 1000.0 * WORDS / get_profile("H100", MODEL).prefill_tokens_per_s
        assert h100_ms < decision["predicted_ttft_ms"] < h100_ms + PRICED_MS, decision

        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 2,
        }
        status, headers, answer = await post(up, "/v1/chat/completions", body)
        assert status == 200, answer
        assert headers.get("x-gtm-region") == "eu-west", headers
        assert answer["usage"]["prompt_tokens"] >= WORDS

"""The regional LB's data path on loopback: admission, zone choice, proxying, errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from gtm.clock import SystemClock
from gtm.models import Drain, DrainTarget
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from tests.integration.regional_lb.conftest import (
    MODEL,
    TIER_KEY,
    RegionFactory,
    StubZone,
    auth,
    chat,
    load,
    publish_zone,
    signed,
    until,
)
from tests.unit.regional_lb.policy_fixtures import KEYS, policy

pytestmark = pytest.mark.integration

ZoneMaker = Callable[..., Coroutine[Any, Any, StubZone]]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_openai_sdk_through_the_regional_lb(
    make_region: RegionFactory, stub_zones: ZoneMaker, store: MemoryStore, clock: SystemClock
) -> None:
    zone = await stub_zones("us-east-a", "us-east")
    region = await make_region("us-east")
    await publish_zone(store, zone, clock)
    await until(lambda: "us-east-a" in region.service.view.zones)
    client = AsyncOpenAI(base_url=region.url + "/v1", api_key=KEYS["alpha"], max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=50
        )
        completion = raw.parse()
        assert completion.usage is not None
        assert completion.usage.completion_tokens == 7
        assert raw.headers["x-gtm-region"] == "us-east"
        assert raw.headers["x-gtm-zone"] == "us-east-a"
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert pieces == [f"t{i} " for i in range(7)]
    finally:
        await client.close()
    assert region.sample("gtm_regional_admitted_total", tenant="alpha", route="local") == 2
    assert region.service.limiter.in_flight("alpha") == 0
    assert region.service.accounting.total_in_flight() == 0
    forwarded = zone.headers[0]
    assert forwarded["x-request-id"]
    # The tenant's key stops at the regional LB, which authenticated it (gtm.credentials).
    assert "authorization" not in forwarded


async def test_refusals_are_openai_errors(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    zone = await stub_zones("us-east-a", "us-east")
    region = await make_region("us-east", peer_token=TIER_KEY)
    await publish_zone(store, zone, clock)
    await until(lambda: "us-east-a" in region.service.view.zones)
    url = region.url + "/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}

    async def status(**kwargs: Any) -> tuple[int, dict[str, Any]]:
        async with http.post(url, **kwargs) as response:
            return response.status, await response.json()

    code, error = await status(json=body)
    assert code == 401
    assert error["error"]["code"] == "invalid_api_key"
    code, error = await status(json=body, headers={"Authorization": "Bearer gtm-nope-nope"})
    assert code == 401
    code, error = await status(data=b"{not json", headers=auth())
    assert (code, error["error"]["code"]) == (400, "invalid_json")
    code, error = await status(json={**body, "model": "no/such-model"}, headers=auth())
    assert (code, error["error"]["code"]) == (404, "model_not_found")
    # demo-eu may only be served in the EU: this region refuses it (451, RFC 7725).
    code, error = await status(json=body, headers=auth("demo-eu"))
    assert code == 451
    assert "residency" in error["error"]["message"]
    # Data classified de-only is processed in Germany only (example residency rules).
    code, error = await status(json=body, headers={**auth(), "x-gtm-data-class": "de-only"})
    assert code == 451
    # Tier headers count from a proven tier (a signed front door) only.
    code, error = await status(json=body, headers={**auth(), **signed({"x-gtm-hops": "9"})})
    assert (code, error["error"]["code"]) == (508, "hop_limit_reached")
    garbled = signed({"x-gtm-client-country": "Germany"})
    code, error = await status(json=body, headers={**auth(), **garbled})
    assert code == 400
    async with http.get(region.url + "/v1/models", headers=auth()) as response:
        assert [m["id"] for m in (await response.json())["data"]] == [MODEL]
    assert zone.requests == []
    assert region.sample("gtm_regional_rejected_total", tenant="demo-eu", reason="residency") == 1


async def test_no_healthy_zone_is_a_retryable_503_and_residency_a_451(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    """The regional tier draws the front door's line: a legal refusal is 451 without
    Retry-After (the same on every retry); allowed but nothing healthy is 503 +
    Retry-After, naming the reason."""
    zone = await stub_zones("us-east-a", "us-east")
    region = await make_region("us-east")
    await publish_zone(store, zone, clock)
    drain = Drain(target=DrainTarget.ZONE, id="us-east-a")
    await store.put(keys.drain(DrainTarget.ZONE, "us-east-a"), codec.encode(drain))

    def drained() -> bool:
        zones = region.service.view.zones
        return "us-east-a" in zones and zones["us-east-a"].drained

    await until(drained)
    url = region.url + "/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    async with http.post(url, json=body, headers=auth()) as response:
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        error = (await response.json())["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "no_healthy_zone")
    async with http.post(url, json=body, headers=auth("demo-eu")) as response:
        assert response.status == 451
        assert "Retry-After" not in response.headers
        error = (await response.json())["error"]
    assert error["code"] == "region_not_allowed"
    assert zone.requests == []


async def test_quota_exceeded_is_a_429_with_retry_after(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    tmp_path: Path,
) -> None:
    tight = policy(tmp_path / "tight", quotas={"alpha": {"requests_per_minute": 60}})
    zone = await stub_zones("us-east-a", "us-east")
    region = await make_region("us-east", policy=tight)
    await publish_zone(store, zone, clock)
    await until(lambda: "us-east-a" in region.service.view.zones)
    client = AsyncOpenAI(base_url=region.url + "/v1", api_key=KEYS["alpha"], max_retries=0)
    try:
        # 60/min: a first burst up to the minute passes (the burst allowance, alone in
        # its pool), and the requests beyond it are refused.
        passed = 0

        async def burst() -> None:
            nonlocal passed
            for _ in range(70):
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "b"}]
                )
                passed += 1

        with pytest.raises(openai.RateLimitError) as caught:
            await burst()
        assert 60 <= passed <= 62
    finally:
        await client.close()
    response = caught.value.response
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["type"] == "requests"
    assert region.sample("gtm_regional_rejected_total", tenant="alpha", reason="requests") == 1


async def test_retries_another_zone_before_the_first_byte(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    broken = await stub_zones("us-east-a", "us-east", status=503)
    good = await stub_zones("us-east-b", "us-east")
    region = await make_region("us-east")
    # The broken zone looks best (empty queue); the good one has a queue.
    await publish_zone(store, broken, clock, load(queued_tokens=0))
    await publish_zone(store, good, clock, load(queued_tokens=40_000))
    await until(lambda: len(region.service.view.zones) == 2)
    async with await chat(http, region) as response:
        assert response.status == 200
        assert response.headers["x-gtm-zone"] == "us-east-b"
    assert len(broken.requests) == 1
    assert (
        region.sample(
            "gtm_regional_upstream_attempts_total", target="us-east-a", outcome="http_503"
        )
        == 1
    )
    assert region.service.accounting.total_in_flight() == 0


async def test_health_ready_and_metrics(
    make_region: RegionFactory, http: aiohttp.ClientSession
) -> None:
    region = await make_region("us-east")
    async with http.get(region.url + "/healthz") as response:
        assert response.status == 200
    await until(lambda: region.service.ready)
    async with http.get(region.url + "/readyz") as response:
        body = await response.json()
        assert response.status == 200
        assert body["region"] == "us-east"
    async with http.get(region.url + "/metrics") as response:
        text = await response.text()
        assert 'gtm_regional_queue_depth{band="interactive"} 0.0' in text
        assert "gtm_regional_quota_lease_share" in text
        # The sizes of its bounded caches, and its event loop's tasks.
        assert "gtm_regional_placement_memory_entries 0.0" in text
        assert "gtm_regional_location_cache_entries 0.0" in text
        assert "gtm_event_loop_tasks " in text

"""A saturated region on loopback: the fair queue, its TTL, cancellation, spillover to an
allowed peer, ``on_saturation: reject``, and the audit trail of spill decisions."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

from gtm.clock import SystemClock
from gtm.geo import ChainLocator, MaxMindLocator
from gtm.models import Priority
from gtm.state.memory import MemoryStore
from policies import AuditWriter, verify
from regional_lb.fairqueue import BandSettings, QueueSettings
from regional_lb.view import ViewSettings
from tests.integration.regional_lb.conftest import (
    TIER_KEY,
    RegionFactory,
    StubZone,
    chat,
    load,
    publish_zone,
    signed,
    until,
)
from tests.unit.global_lb.helpers import write_city_db

pytestmark = pytest.mark.integration

ZoneMaker = Callable[..., Coroutine[Any, Any, StubZone]]

#: A zone with room for exactly one running request (no extra queue per GPU).
ONE_SLOT = ViewSettings(queue_depth_per_gpu=0)
SHORT_TTL = QueueSettings(
    bands=MappingProxyType({p: BandSettings(ttl_s=0.3, max_depth=10) for p in Priority})
)
#: Shared by the regional LBs of a test: spilled requests are charged once, at origin,
#: and a signed client location (as the front door sends it) is believed.
TOKEN = TIER_KEY


def us() -> dict[str, str]:
    """A US client's request as the front door sends it (signed now)."""
    return signed({"x-gtm-client-country": "US"})


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def full_region(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    region_id: str = "us-east",
    **settings: Any,
) -> tuple[Any, StubZone]:
    zone = await stub_zones(f"{region_id}-a", region_id, gate=asyncio.Event())
    region = await make_region(region_id, view=ONE_SLOT, **settings)
    await publish_zone(store, zone, clock, load(gpus=1, max_running=1))
    await until(lambda: f"{region_id}-a" in region.service.view.zones)
    return region, zone


async def test_a_saturated_region_queues_and_serves_when_a_slot_frees(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    region, zone = await full_region(make_region, stub_zones, store, clock)
    first = asyncio.ensure_future(chat(http, region))  # noqa: TID251 (a test's own task)
    await until(lambda: zone.in_flight == 1)
    second = asyncio.ensure_future(chat(http, region))  # noqa: TID251
    await until(lambda: len(region.service.queue) == 1)
    assert zone.gate is not None
    zone.gate.set()
    async with await first as one, await second as two:
        assert (one.status, two.status) == (200, 200)
    assert region.sample("gtm_regional_admitted_total", tenant="alpha", route="queue") == 1
    assert region.sample("gtm_regional_queue_wait_seconds_count", band="interactive") == 1
    assert len(region.service.queue) == 0
    assert region.service.accounting.total_in_flight() == 0


async def test_the_band_ttl_answers_503_with_retry_after(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    region, zone = await full_region(make_region, stub_zones, store, clock, queue=SHORT_TTL)
    first = asyncio.ensure_future(chat(http, region))  # noqa: TID251
    await until(lambda: zone.in_flight == 1)
    async with await chat(http, region) as response:
        assert response.status == 503
        assert int(response.headers["Retry-After"]) >= 1
        assert (await response.json())["error"]["code"] == "queue_timeout"
    assert region.service.limiter.in_flight("alpha") == 1  # the timed-out one was released
    assert zone.gate is not None
    zone.gate.set()
    async with await first as one:
        assert one.status == 200
    assert region.sample("gtm_regional_rejected_total", tenant="alpha", reason="queue_timeout") == 1


async def test_a_client_leaving_the_queue_releases_everything(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    region, zone = await full_region(make_region, stub_zones, store, clock)
    first = asyncio.ensure_future(chat(http, region))  # noqa: TID251
    await until(lambda: zone.in_flight == 1)
    waiting = asyncio.ensure_future(chat(http, region))  # noqa: TID251
    await until(lambda: len(region.service.queue) == 1)
    waiting.cancel()  # the client goes away: its connection closes
    await until(lambda: len(region.service.queue) == 0)
    await until(lambda: region.service.limiter.in_flight("alpha") == 1)
    assert zone.gate is not None
    zone.gate.set()
    async with await first as one:
        assert one.status == 200
    await until(lambda: region.service.limiter.in_flight("alpha") == 0)
    assert len(zone.requests) == 1  # the cancelled request never reached a zone


async def test_spills_to_the_best_allowed_peer_and_audits_it(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    audit = AuditWriter(tmp_path / "audit", prefix="regional")
    origin, origin_zone = await full_region(make_region, stub_zones, store, clock, peer_token=TOKEN)
    origin.service.admission.audit_log = audit  # the fixture builds services without one
    peer_zone = await stub_zones("us-west-a", "us-west")
    peer = await make_region("us-west", peer_token=TOKEN)
    await publish_zone(store, peer_zone, clock)
    await until(lambda: "us-west-a" in peer.service.view.zones)
    await peer.service.publish_summary()
    await until(lambda: origin.service.view.peers["us-west"].summary is not None)
    first = asyncio.ensure_future(chat(http, origin, headers=us()))  # noqa: TID251
    await until(lambda: origin_zone.in_flight == 1)
    async with await chat(http, origin, headers=us()) as response:
        assert response.status == 200, await response.text()
        assert response.headers["x-gtm-region"] == "us-west"
        assert response.headers["x-gtm-spilled-from"] == "us-east"
    # The zone is told nothing of the tiers' own: no tier header passes a regional LB.
    forwarded = peer_zone.headers[0]
    assert not {"x-gtm-spilled-from", "x-gtm-hops", "x-gtm-tier-auth"} & set(forwarded)
    assert peer.service.limiter.take_demand("alpha").units == {}  # not charged twice
    assert origin.sample("gtm_regional_spills_total", peer="us-west", reason="saturated") == 1
    assert peer.sample("gtm_regional_spilled_in_total", origin="us-east") == 1
    assert origin_zone.gate is not None
    origin_zone.gate.set()
    async with await first as one:
        assert one.status == 200
    audit.close()
    report = verify([tmp_path / "audit"])
    assert report.ok
    assert report.records == 2  # the first request served here, the second spilled


async def test_a_direct_client_located_here_is_spilled_when_the_region_is_full(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """No front door in the path: the client's trusted proxy (127.0.0.1) names it in
    X-Forwarded-For, the full region locates it (a US address) and spills it to an
    allowed peer, as it would a located client the front door sent."""
    locator = ChainLocator(MaxMindLocator(write_city_db(tmp_path / "city.mmdb")))
    trusted = (ipaddress.ip_network("127.0.0.1/32"),)
    origin, origin_zone = await full_region(
        make_region,
        stub_zones,
        store,
        clock,
        peer_token=TOKEN,
        trusted_proxies=trusted,
        locator=locator,
    )
    peer_zone = await stub_zones("us-west-a", "us-west")
    peer = await make_region("us-west", peer_token=TOKEN)
    await publish_zone(store, peer_zone, clock)
    await until(lambda: "us-west-a" in peer.service.view.zones)
    await peer.service.publish_summary()
    await until(lambda: origin.service.view.peers["us-west"].summary is not None)
    new_york = {"X-Forwarded-For": "216.160.83.56"}
    first = asyncio.ensure_future(chat(http, origin, headers=new_york))  # noqa: TID251
    await until(lambda: origin_zone.in_flight == 1)
    async with await chat(http, origin, headers=new_york) as response:
        assert response.status == 200, await response.text()
        assert response.headers["x-gtm-region"] == "us-west"
        assert response.headers["x-gtm-spilled-from"] == "us-east"
    assert origin.sample("gtm_regional_client_location_total", source="trusted-proxy-xff") == 2
    assert peer.sample("gtm_regional_client_location_total", source="signed-upstream") == 1
    assert origin_zone.gate is not None
    origin_zone.gate.set()
    async with await first as one:
        assert one.status == 200


async def test_spillover_stays_inside_the_residency_allowed_set(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    """A German client (GDPR: EEA only) at a full eu-west: us-west has room but is not
    allowed, so the request waits; once eu-central has room, it goes there."""
    origin, zone = await full_region(
        make_region,
        stub_zones,
        store,
        clock,
        region_id="eu-west",
        queue=SHORT_TTL,
        peer_token=TOKEN,
    )
    us_zone = await stub_zones("us-west-a", "us-west")
    us = await make_region("us-west")
    await publish_zone(store, us_zone, clock)
    await until(lambda: "us-west-a" in us.service.view.zones)
    await us.service.publish_summary()
    await until(lambda: origin.service.view.peers["us-west"].summary is not None)

    def germany() -> dict[str, str]:
        return signed({"x-gtm-client-country": "DE"})

    first = asyncio.ensure_future(chat(http, origin, headers=germany()))  # noqa: TID251
    await until(lambda: zone.in_flight == 1)
    async with await chat(http, origin, headers=germany()) as response:
        assert response.status == 503  # waited its TTL; never sent to us-west
    assert us_zone.requests == []
    eu_zone = await stub_zones("eu-central-a", "eu-central")
    eu = await make_region("eu-central", peer_token=TOKEN)
    await publish_zone(store, eu_zone, clock)
    await until(lambda: "eu-central-a" in eu.service.view.zones)
    await eu.service.publish_summary()
    await until(lambda: origin.service.view.peers["eu-central"].summary is not None)
    async with await chat(http, origin, headers=germany()) as response:
        assert response.status == 200
        assert response.headers["x-gtm-region"] == "eu-central"
    assert us_zone.requests == []
    assert zone.gate is not None
    zone.gate.set()
    async with await first as one:
        assert one.status == 200


async def test_on_saturation_reject_is_honoured(
    make_region: RegionFactory,
    stub_zones: ZoneMaker,
    store: MemoryStore,
    clock: SystemClock,
    http: aiohttp.ClientSession,
) -> None:
    """acme-health's residency rule says ``on_saturation: reject``: never spilled, even
    to an allowed US peer with room."""
    origin, zone = await full_region(
        make_region, stub_zones, store, clock, queue=SHORT_TTL, peer_token=TOKEN
    )
    peer_zone = await stub_zones("us-west-a", "us-west")
    peer = await make_region("us-west")
    await publish_zone(store, peer_zone, clock)
    await until(lambda: "us-west-a" in peer.service.view.zones)
    await peer.service.publish_summary()
    await until(lambda: origin.service.view.peers["us-west"].summary is not None)
    first = asyncio.ensure_future(chat(http, origin, tenant="acme-health", headers=us()))  # noqa: TID251
    await until(lambda: zone.in_flight == 1)
    async with await chat(http, origin, tenant="acme-health", headers=us()) as response:
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "queue_timeout"
    assert peer_zone.requests == []
    assert origin.sample("gtm_regional_spills_total", peer="us-west", reason="saturated") == 0
    assert zone.gate is not None
    zone.gate.set()
    async with await first as one:
        assert one.status == 200

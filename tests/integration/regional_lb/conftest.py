"""Regional LBs on 127.0.0.1:0 in front of stand-in zone upstreams, over a shared store.

:class:`StubZone` is a test-only zone upstream: an aiohttp app answering the OpenAI
chat/completions API (JSON or SSE, with ``usage``), which can hold its answers behind
a gate (to fill a region) or fail (to test retries). Tests that need a real zone agent
use ``zone_agent`` in front of fleetsim emulated GPUs instead.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from gtm.clock import Clock, SystemClock
from gtm.geo import GeoLocator
from gtm.metrics import new_registry
from gtm.models import Endpoint, ModelLoad, RegionSummary, Zone, ZoneSummary
from gtm.policy_store import ActivePolicy
from gtm.state import codec, keys
from gtm.state.memory import MemoryStore
from gtm.state.store import StateStore
from gtm.trust import GLOBAL_ISSUER, TierKey
from regional_lb.app import RegionalService, RegionalSettings, serving
from tests.unit.regional_lb.policy_fixtures import KEYS, policy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: A bound on waiting for something a server does, not a sleep.
EVENTUALLY_S = 5.0


@dataclass
class StubZone:
    """A stand-in zone agent (test only)."""

    zone_id: str
    region_id: str
    status: int = 200
    gate: asyncio.Event | None = None
    output_tokens: int = 7
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._chat)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.status != 200:
            return web.json_response(
                {"error": {"message": "stub failure", "type": "server_error"}}, status=self.status
            )
        self.in_flight += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            usage = {"prompt_tokens": 11, "completion_tokens": self.output_tokens}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            if not body.get("stream"):
                return web.json_response(
                    {
                        "id": "chatcmpl-stub",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "ok " * 3},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": usage,
                    },
                    headers={"x-gtm-zone": self.zone_id},
                )
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "x-gtm-zone": self.zone_id}
            )
            await response.prepare(request)
            for i in range(self.output_tokens):
                chunk = {
                    "id": "chatcmpl-stub",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
                    ],
                }
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            self.in_flight -= 1


def load(
    *,
    gpus: int = 2,
    healthy: int | None = None,
    running: int = 0,
    waiting: int = 0,
    max_running: int = 64,
    queued_tokens: int = 0,
    rate: float = 20_000.0,
    model: str = MODEL,
) -> ModelLoad:
    return ModelLoad(
        model=model,
        gpus=gpus,
        healthy_gpus=gpus if healthy is None else healthy,
        prefill_tokens_per_s=rate,
        queued_prefill_tokens=queued_tokens,
        running_requests=running,
        waiting_requests=waiting,
        max_running_requests=max_running,
    )


async def publish_zone(
    store: StateStore,
    zone: StubZone | tuple[str, str, str],
    clock: Clock,
    *models: ModelLoad,
    healthy: bool = True,
    sketch: tuple[int, ...] = (),
) -> None:
    """A Zone record with the zone's URL, and its summary (as a zone agent would)."""
    if isinstance(zone, StubZone):
        zone_id, region_id, url = zone.zone_id, zone.region_id, zone.url
    else:
        zone_id, region_id, url = zone
    await store.put(
        keys.zone(region_id, zone_id),
        codec.encode(Zone(id=zone_id, region_id=region_id, endpoints=(Endpoint(url=url),))),
    )
    summary = ZoneSummary(
        zone_id=zone_id,
        region_id=region_id,
        published_at=clock.wall(),
        healthy=healthy,
        models=models or (load(),),
        prefix_sketch=sketch,
    )
    await store.put(keys.zone_summary(region_id, zone_id), codec.encode(summary))


async def publish_region(
    store: StateStore, region_id: str, url: str, clock: Clock, *models: ModelLoad, **fields: Any
) -> None:
    """A peer region's summary, as its regional LB would publish it."""
    summary = RegionSummary(
        region_id=region_id,
        published_at=clock.wall(),
        zones_total=1,
        zones_healthy=1,
        models=models or (load(),),
        endpoints=(Endpoint(url=url),),
        **fields,
    )
    await store.put(keys.region_summary(region_id), codec.encode(summary))


@dataclass
class Region:
    service: RegionalService
    url: str

    def sample(self, name: str, **labels: str) -> float:
        value = self.service.registry.get_sample_value(name, labels)
        return value or 0.0


RegionFactory = Callable[..., Coroutine[Any, Any, Region]]


@pytest.fixture
def clock() -> SystemClock:
    return SystemClock()


@pytest.fixture
def store(clock: SystemClock) -> MemoryStore:
    return MemoryStore(clock)


@pytest.fixture
def active_policy(tmp_path: Path) -> ActivePolicy:
    return policy(tmp_path / "policies")


@pytest.fixture
async def stub_zones() -> AsyncIterator[Callable[..., Coroutine[Any, Any, StubZone]]]:
    started: list[StubZone] = []

    async def make(zone_id: str, region_id: str, **options: Any) -> StubZone:
        zone = StubZone(zone_id, region_id, **options)
        await zone.start()
        started.append(zone)
        return zone

    yield make
    for zone in started:
        if zone.gate is not None:
            zone.gate.set()
        await zone.stop()


@pytest.fixture
async def make_region(
    store: MemoryStore, clock: SystemClock, active_policy: ActivePolicy
) -> AsyncIterator[RegionFactory]:
    """``await make_region("us-east", **settings)`` → a running regional LB."""
    stacks: list[Any] = []

    async def make(
        region: str,
        *,
        policy: ActivePolicy | None = None,
        store_override: StateStore | None = None,
        static_policy: bool = True,
        locator: GeoLocator | None = None,
        **settings: Any,
    ) -> Region:
        base = RegionalSettings(region=region, replica_id=f"{region}-r1", queue_tick_s=0.01)
        service = RegionalService(
            replace(base, **settings),
            store=store_override or store,
            clock=clock,
            registry=new_registry(),
            policy=(policy or active_policy) if static_policy else None,
            locator=locator,
        )
        context = serving(service, "127.0.0.1", 0)
        bound = await context.__aenter__()
        stacks.append(context)
        await service.snapshots.wait_ready()
        return Region(service, bound.url)

    yield make
    for context in reversed(stacks):
        await context.__aexit__(None, None, None)


async def until(predicate: Callable[[], bool]) -> None:
    """Wait for ``predicate`` to hold (bounded); for effects of other tasks."""
    deadline = asyncio.get_running_loop().time() + EVENTUALLY_S
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


#: The tiers' key of the regional LBs that tests give ``peer_token=TIER_KEY``.
TIER_KEY = "tier-key-of-the-tests"


def signed(
    headers: dict[str, str], *, issuer: str = GLOBAL_ISSUER, key: str = TIER_KEY
) -> dict[str, str]:
    """``headers`` as the front door (or ``region/<id>``) sends them: signed with ``key``,
    so a regional LB with that key believes their x-gtm- headers."""
    out: CIMultiDict[str] = CIMultiDict({"x-request-id": uuid.uuid4().hex, **headers})
    TierKey(key).sign(out, issuer=issuer, now=time.time())
    return dict(out)


def auth(tenant: str = "alpha") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


async def chat(
    http: aiohttp.ClientSession,
    region: Region,
    *,
    tenant: str = "alpha",
    headers: dict[str, str] | None = None,
    **body: Any,
) -> aiohttp.ClientResponse:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], **body}
    return await http.post(
        region.url + "/v1/chat/completions",
        json=payload,
        headers={**auth(tenant), **(headers or {})},
    )

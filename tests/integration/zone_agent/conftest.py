"""A zone of emulated workers (in-process, 127.0.0.1:0) behind a real zone agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.gpu_profiles import BGE_LARGE, LLAMA_8B
from gtm.metrics import new_registry
from gtm.serve import HttpServerKind
from gtm.state.store import StateStore
from zone_agent.accounting import SlotLoad
from zone_agent.app import ZoneAgent
from zone_agent.config import StaticWorker, ZoneConfig, parse_worker
from zone_agent.health import HealthConfig

#: Emulated GPUs run this much faster than real ones: a 100-token answer is ~1 ms.
SPEEDUP = 1000.0

#: How long a test waits for something an external server does (the emulator has no
#: event to await for "request aborted"); a bound, not a sleep.
EVENTUALLY_S = 5.0


@dataclass
class Zone:
    agent: ZoneAgent
    sims: list[GpuSimServer]
    client: AsyncOpenAI
    http: aiohttp.ClientSession
    ids: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.agent.url

    def sim(self, gpu_id: str) -> GpuSimServer:
        return self.sims[self.ids.index(gpu_id)]

    async def faults(self, sim: GpuSimServer, body: dict[str, Any] | None = None) -> None:
        method = "POST" if body is not None else "DELETE"
        async with self.http.request(method, sim.url + "/admin/faults", json=body) as response:
            assert response.status == 200, await response.text()

    async def no_leaks(self) -> None:
        """Every charge released (awaits the last ticket), nothing held."""
        await asyncio.wait_for(self.agent.accounting.wait_idle(), EVENTUALLY_S)
        assert self.agent.accounting.totals() == SlotLoad()

    def served_by(self, gpu_id: str) -> float:
        value = self.agent.registry.get_sample_value(
            "gtm_zone_assignments_total", {"gpu": gpu_id, "profile": self.agent.profile.name}
        )
        return value or 0.0


async def eventually(predicate: Callable[[], Coroutine[Any, Any, bool]]) -> None:
    """Poll an external server's state until ``predicate`` holds (bounded)."""
    deadline = asyncio.get_running_loop().time() + EVENTUALLY_S
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


ZoneFactory = Callable[..., Coroutine[Any, Any, Zone]]

FAST_HEALTH = HealthConfig(
    check_interval_s=0.2,
    check_timeout_s=0.5,
    consecutive_failures=2,
    base_ejection_s=30.0,
    max_ejected_fraction=0.5,
    slow_start_s=0.0,
)


def sim_config(gpu_type: str, **overrides: Any) -> GpuSimConfig:
    options: dict[str, Any] = {
        "port": 0,
        "speedup": SPEEDUP,
        "gpu_type": gpu_type,
        "models": (LLAMA_8B, BGE_LARGE),
        "seed": 1,
        "warmup_passes": 0,
    }
    options.update(overrides)
    return GpuSimConfig.model_validate(options)


@pytest.fixture(params=[HttpServerKind.LEAN, HttpServerKind.AIOHTTP], ids=str)
def http_server(request: pytest.FixtureRequest) -> HttpServerKind:
    """Each zone test runs on both servers of the OpenAI endpoints (gtm zone --http-server)."""
    kind: HttpServerKind = request.param
    return kind


@pytest.fixture
async def make_zone(http_server: HttpServerKind) -> AsyncIterator[ZoneFactory]:
    """``await make_zone(["H100", "A100-80GB"], **config)`` → a running zone."""
    zones: list[Zone] = []
    sims_started: list[GpuSimServer] = []

    async def make(
        gpu_types: Sequence[str] = ("H100", "H100"),
        *,
        extra_workers: Sequence[str] = (),
        store: StateStore | None = None,
        sim_overrides: dict[str, Any] | None = None,
        **config: Any,
    ) -> Zone:
        sims = []
        for gpu_type in gpu_types:
            sim = GpuSimServer(
                sim_config(gpu_type, **(sim_overrides or {})), registry=new_registry()
            )
            await sim.start()
            sims.append(sim)
            sims_started.append(sim)
        workers: list[StaticWorker] = [
            parse_worker(f"{s.url},gpu={s.config.gpu_type},id=gpu-{i}") for i, s in enumerate(sims)
        ]
        workers += [parse_worker(w) for w in extra_workers]
        options: dict[str, Any] = {
            "zone": "zone-a",
            "region": "region-1",
            "port": 0,
            "workers": tuple(workers),
            "health": FAST_HEALTH,
            "scrape_interval_s": 0.1,
            "http_server": http_server,
        }
        options.update(config)
        registry = new_registry()
        agent = ZoneAgent(ZoneConfig.model_validate(options), registry=registry, store=store)
        await agent.start()
        client = AsyncOpenAI(base_url=agent.url + "/v1", api_key="k", max_retries=0, timeout=20.0)
        zone = Zone(
            agent, sims, client, aiohttp.ClientSession(), [w.id for w in workers[: len(sims)]]
        )
        zones.append(zone)
        return zone

    yield make
    for zone in zones:
        await zone.client.close()
        await zone.http.close()
        await zone.agent.stop()
    for sim in sims_started:
        await sim.stop()

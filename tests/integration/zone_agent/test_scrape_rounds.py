"""A black-holed worker (it accepts connections and never answers) among emulated ones:
the others' scrapes go on at the zone's interval, the view keeps trusting their
numbers, and the dead worker's scrape is not started again while one is still going.
Before, every round waited for the dead worker's scrape timeout, so every GPU's numbers
were a timeout old and distrusted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gtm.gpu_profiles import LLAMA_8B

from .conftest import Zone, ZoneFactory

pytestmark = pytest.mark.integration

SCRAPE_TIMEOUT_S = 2.0
INTERVAL_S = 0.2


@dataclass
class BlackHole:
    """Reads each request's first line and never answers; counts /metrics requests."""

    port: int = 0
    scrapes: int = 0
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _never: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            line = await reader.readline()
            if line.startswith(b"GET /metrics"):
                self.scrapes += 1
            await self._never.wait()
        finally:
            # (Also a connection accepted while the fixture tears down, after its loop
            # over the writers: the agent still scrapes then. Left open, its socket was
            # collected in a later test and failed it with a ResourceWarning.)
            writer.close()


@pytest.fixture
async def hole() -> AsyncIterator[BlackHole]:
    black_hole = BlackHole()
    server = await asyncio.start_server(black_hole.handle, "127.0.0.1", 0)
    black_hole.port = server.sockets[0].getsockname()[1]
    yield black_hole
    server.close()
    for writer in black_hole._writers:
        writer.close()
    black_hole._never.set()
    await server.wait_closed()


async def test_a_black_holed_worker_does_not_hold_the_others_scrapes(
    make_zone: ZoneFactory, hole: BlackHole
) -> None:
    # (Start-up's first look waits for every worker: the dead one's timeout, once.)
    zone = await make_zone(
        ["H100", "H100"],
        extra_workers=[f"http://127.0.0.1:{hole.port},gpu=H100,id=gpu-dead,model={LLAMA_8B}"],
        scrape_interval_s=INTERVAL_S,
        scrape_timeout_s=SCRAPE_TIMEOUT_S,
        stale_after_s=1.0,
    )
    agent = zone.agent
    blind_before = await _by_gpu(zone, "gtm_zone_blind_views_total")
    rounds_before = await _rounds(zone)
    scrapes_before = hole.scrapes
    started = time.monotonic()
    await agent.scrape_round()
    took = time.monotonic() - started
    # The live workers answered at once; the round ends then, or at its interval.
    assert took < SCRAPE_TIMEOUT_S / 2
    index = agent.view.by_model[LLAMA_8B]
    fresh = dict(zip(index.ids, index.fresh.tolist(), strict=True))
    assert fresh == {"gpu-0": True, "gpu-1": True, "gpu-dead": False}
    for gpu in ("gpu-0", "gpu-1"):
        state = agent.view.gpu(gpu)
        assert state is not None
        assert state.metrics is not None
        assert time.monotonic() - state.metrics.scraped_at < INTERVAL_S * 2
    # The dead worker's scrape is still going: the next rounds leave it be.
    await agent.scrape_round()
    await agent.scrape_round()
    assert hole.scrapes - scrapes_before <= 1
    assert time.monotonic() - started < SCRAPE_TIMEOUT_S
    # What an operator's Prometheus reads off the agent: the live GPUs' scrapes are young,
    # and no view since was blind to them; every one was to the dead one (the three
    # rounds', and any the agent's own loops built meanwhile).
    ages = await _by_gpu(zone, "gtm_zone_scrape_age_seconds")
    assert ages["gpu-0"] < 3 * INTERVAL_S
    assert ages["gpu-1"] < 3 * INTERVAL_S
    blind = await _by_gpu(zone, "gtm_zone_blind_views_total")
    grew = {gpu: blind.get(gpu, 0.0) - blind_before.get(gpu, 0.0) for gpu in ages | blind}
    assert (grew["gpu-0"], grew["gpu-1"]) == (0.0, 0.0)
    assert grew["gpu-dead"] >= 3.0
    # Each of the three rounds ended at its interval, the dead worker's scrape still going.
    rounds = await _rounds(zone)
    assert rounds.get("interval", 0.0) - rounds_before.get("interval", 0.0) >= 3.0


async def _rounds(zone: Zone) -> dict[str, float]:
    """``gtm_zone_scrape_rounds_total`` by how the rounds ended."""
    return await _by_gpu(zone, "gtm_zone_scrape_rounds_total", label="ended")


async def _by_gpu(zone: Zone, name: str, label: str = "gpu") -> dict[str, float]:
    """The samples of ``name`` by GPU (or ``label``), read off the agent's /metrics."""
    async with zone.http.get(f"{zone.agent.url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        sample.labels[label]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }
